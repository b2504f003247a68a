// gradcomm-gossip-bench: a real optimisation (multinomial logistic
// regression on synthetic data, bench/gossip_problem.hpp) trained with
// synchronous SGD through the Reducer ("allreduce") or with push-sum gossip
// through the GossipAverager ("gossip"), to compare time to a target loss,
// final loss and steps per second, optionally with one rank slowed down
// (--straggler RANK:FACTOR) or killed mid-run (--kill RANK:STEP). Gossip
// ranks stop by the gossip clock (GossipStats::clock), so a slow rank takes
// fewer steps of its own.
//
//   mpirun -np 4 gradcomm-gossip-bench --mode both --steps 400 --target-loss 1.2 --straggler 3:2
//   scripts/netns-cluster --hosts 4 --ppn 1 --rate 1gbit --no-mpi -- gradcomm-gossip-bench --kill 2:100 ...
//
// Each rank evaluates its own parameters on a shared held-out set every
// --eval-every steps; evaluation time is not counted as training time. A
// rank's time to target is the training time at which its own loss first
// fell to the target; the run's is the last rank's. The final loss is that
// of the averaged model (gossip: after GossipAverager::synchronize()).
#if GRADCOMM_HAVE_MPI
#include <mpi.h>
#endif
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gossip_problem.hpp"
#include "gradcomm/gossip.hpp"
#include "gradcomm/gradcomm.hpp"
#include "gradcomm/reducer.hpp"
#include "launch.hpp"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

int gRank = 0;

[[noreturn]] void die(const std::string& m) {
  if (gRank == 0) std::fprintf(stderr, "gradcomm-gossip-bench: %s\n", m.c_str());
  bench::finalizeMpiIfUp();
  std::exit(2);
}

long long parseInteger(const std::string& text, const std::string& what, long long lo, long long hi) {
  return bench::wholeNumberOr(text, what, lo, hi, die);
}

double parseNumber(const std::string& text, const std::string& what, double lo, double hi) {
  const auto v = bench::realNumber(text);
  if (!v || *v < lo || *v > hi) {
    die(what + " must be a number from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" + text + "'");
  }
  return *v;
}

// "RANK:VALUE" (--straggler 3:2, --kill 2:100).
std::pair<int, double> rankAndValue(const std::string& text, const std::string& what, double lo, double hi) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) die(what + " takes RANK:VALUE, got '" + text + "'");
  const int rank = static_cast<int>(parseInteger(text.substr(0, colon), what + "'s RANK", 0, 1 << 20));
  return {rank, parseNumber(text.substr(colon + 1), what + "'s VALUE", lo, hi)};
}

struct Args {
  std::string mode = "both";
  int steps = 300;
  double lr = 0.5;
  bool cosine = false;  // --lr-schedule cosine: lr x (1 + cos(pi s / steps)) / 2
  double targetLoss = 0;  // 0: none
  int evalEvery = 10;
  double computeMs = 0;   // pad each step's compute (sleep) to at least this
  int stragglerRank = -1;
  double stragglerFactor = 1;
  int killRank = -1;
  int killStep = 0;
  std::string transport;
  std::string json;
  bench::SoftmaxSpec spec;
};

struct Result {
  std::string mode;
  int stepsDone = 0;
  double trainSeconds = 0;
  double timeToTarget = -1;  // this rank's
  double finalLoss = 0;      // averaged model (or this rank's own, when it cannot be averaged)
  double consensus = -1;
  std::string error;
  GossipStats gossip;
  double computeMs = 0;  // mean per step: gradient, padding and straggler sleep
  double commMs = -1;    // allreduce mode: mean per step of the Reducer's allreduce
};

// One step's compute: the gradient, then the padding and the straggler's
// slow-down (sleeps, so a slow rank does not steal a core from the others).
void compute(const bench::SoftmaxProblem& p, const Args& a, const float* params, uint64_t step, float* grad) {
  const auto t0 = Clock::now();
  p.gradient(params, step, grad);
  auto spent = Clock::now() - t0;
  const auto pad = std::chrono::duration<double, std::milli>(a.computeMs);
  if (spent < pad) {
    std::this_thread::sleep_for(pad - spent);
    spent = std::chrono::duration_cast<Clock::duration>(pad);
  }
  if (gRank == a.stragglerRank && a.stragglerFactor > 1) {
    std::this_thread::sleep_for(std::chrono::duration_cast<Clock::duration>(spent * (a.stragglerFactor - 1)));
  }
}

[[noreturn]] void dieHere() {
  std::fprintf(stderr, "gradcomm-gossip-bench: rank %d: killing itself (--kill)\n", gRank);
  std::fflush(stderr);
  raise(SIGKILL);
  std::abort();
}

Result run(Communicator& comm, const Args& a, const std::string& mode) {
  Result r;
  r.mode = mode;
  const bench::SoftmaxProblem problem(a.spec, comm.rank());
  const size_t n = problem.paramCount();
  std::vector<float> params(n, 0.0f), grad(n);
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<GossipAverager> gossip;
  if (mode == "allreduce") {
    reducer = std::make_unique<Reducer>(comm, std::vector<GradientSpec>{{n, DataType::kFloat32, grad.data()}});
  } else {
    gossip = std::make_unique<GossipAverager>(comm, std::vector<GossipBuffer>{{params.data(), n}});
  }
  comm.barrier().wait();
  Clock::duration training{};
  double commSum = 0;
  auto segment = Clock::now();
  // Where the run is, in steps: allreduce-SGD's step count, gossip's clock
  // (a slow rank adopts its peers' clock, so all ranks stop together and a
  // slow one computes fewer gradients: a rank that stopped early would look
  // dead to those still gossiping).
  auto position = [&](int s) -> uint64_t { return gossip ? gossip->stats().clock : static_cast<uint64_t>(s); };
  try {
    for (int s = 0; position(s) < static_cast<uint64_t>(a.steps); ++s) {
      if (gRank == a.killRank && s == a.killStep) dieHere();
      const double t = static_cast<double>(position(s));
      const float lr = static_cast<float>(
          a.cosine ? a.lr * 0.5 * (1 + std::cos(3.141592653589793 * t / a.steps)) : a.lr);
      const auto computeStart = Clock::now();
      compute(problem, a, params.data(), static_cast<uint64_t>(s), grad.data());
      r.computeMs += std::chrono::duration<double, std::milli>(Clock::now() - computeStart).count();
      if (reducer) {
        reducer->markReady(0);
        reducer->finalize();
        commSum += reducer->lastStepStats().commMs;
        for (size_t i = 0; i < n; ++i) params[i] -= lr * grad[i];
      } else {
        for (size_t i = 0; i < n; ++i) params[i] -= lr * grad[i];
        gossip->step();
      }
      r.stepsDone = s + 1;
      if ((s + 1) % a.evalEvery == 0 || position(s + 1) >= static_cast<uint64_t>(a.steps)) {
        training += Clock::now() - segment;
        const double loss = problem.loss(params.data());
        if (a.targetLoss > 0 && r.timeToTarget < 0 && loss <= a.targetLoss) {
          r.timeToTarget = std::chrono::duration<double>(training).count();
        }
        segment = Clock::now();
      }
    }
  } catch (const Error& e) {
    training += Clock::now() - segment;
    r.error = e.what();
  }
  r.trainSeconds = std::chrono::duration<double>(training).count();
  if (r.stepsDone > 0) {
    r.computeMs /= r.stepsDone;
    if (reducer) r.commMs = commSum / r.stepsDone;
  }
  if (gossip) r.gossip = gossip->stats();
  if (!r.error.empty()) {
    r.finalLoss = problem.loss(params.data());
    return r;
  }
  if (a.killRank >= 0 || (gossip && !r.gossip.removedPeers.empty())) {
    // No collective over a dead rank: this rank's own model.
    r.finalLoss = problem.loss(params.data());
    return r;
  }
  try {
    if (gossip) {
      // Consensus distance before the exact average (RMS over ranks).
      std::vector<float> mean(n);
      comm.allreduce(params.data(), mean.data(), n, DataType::kFloat32, ReduceOp::kAvg).wait();
      double sq = 0;
      for (size_t i = 0; i < n; ++i) sq += (params[i] - mean[i]) * static_cast<double>(params[i] - mean[i]);
      double total = 0;
      comm.allreduce(&sq, &total, 1, DataType::kFloat64, ReduceOp::kAvg).wait();
      r.consensus = std::sqrt(total);
      gossip->synchronize();
    } else {
      r.consensus = 0;
    }
  } catch (const Error& e) {
    r.error = e.what();
  }
  r.finalLoss = problem.loss(params.data());
  return r;
}

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string stragglerText(const Args& a) {
  if (a.stragglerRank < 0) return "none";
  std::ostringstream s;
  s << a.stragglerRank << ":" << a.stragglerFactor;
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  const bool useMpi = bench::startMpiUnlessLaunchedWithout(argc, argv, &gRank);
  Args a;
  for (bench::ArgWalk w(argc, argv, die); w.next();) {
    const std::string& k = w.key();
    auto next = [&] { return w.value(); };
    if (k == "--mode") a.mode = next();
    else if (k == "--steps") a.steps = static_cast<int>(parseInteger(next(), "--steps", 1, 100000000));
    else if (k == "--lr") a.lr = parseNumber(next(), "--lr", 1e-9, 1e3);
    else if (k == "--lr-schedule") {
      const std::string v = next();
      if (v != "constant" && v != "cosine") die("unknown --lr-schedule '" + v + "'; valid: constant, cosine");
      a.cosine = v == "cosine";
    }
    else if (k == "--target-loss") a.targetLoss = parseNumber(next(), "--target-loss", 0, 1e9);
    else if (k == "--eval-every") a.evalEvery = static_cast<int>(parseInteger(next(), "--eval-every", 1, 1000000));
    else if (k == "--compute-ms") a.computeMs = parseNumber(next(), "--compute-ms", 0, 1e6);
    else if (k == "--features") a.spec.features = static_cast<size_t>(parseInteger(next(), "--features", 1, 1 << 24));
    else if (k == "--classes") a.spec.classes = static_cast<size_t>(parseInteger(next(), "--classes", 2, 1 << 16));
    else if (k == "--samples") a.spec.samplesPerRank = static_cast<size_t>(parseInteger(next(), "--samples", 1, 1 << 26));
    else if (k == "--eval-samples") a.spec.evalSamples = static_cast<size_t>(parseInteger(next(), "--eval-samples", 1, 1 << 26));
    else if (k == "--batch") a.spec.batch = static_cast<size_t>(parseInteger(next(), "--batch", 1, 1 << 20));
    else if (k == "--seed") a.spec.seed = static_cast<uint64_t>(parseInteger(next(), "--seed", 0, 1LL << 62));
    else if (k == "--straggler") {
      auto [rank, factor] = rankAndValue(next(), "--straggler", 1, 1000);
      a.stragglerRank = rank;
      a.stragglerFactor = factor;
    } else if (k == "--kill") {
      auto [rank, step] = rankAndValue(next(), "--kill", 0, 1e8);
      if (step != std::floor(step)) die("--kill's STEP must be a whole number");
      a.killRank = rank;
      a.killStep = static_cast<int>(step);
    } else if (k == "--transport") a.transport = next();
    else if (k == "--json") a.json = next();
    else if (k == "--no-mpi") continue;
    else if (k == "-h" || k == "--help") {
      if (gRank == 0) {
        std::printf(
            "usage: mpirun -np N gradcomm-gossip-bench [--mode allreduce|gossip|both] [--steps N] [--lr LR]\n"
            "         [--lr-schedule constant|cosine] [--target-loss L] [--eval-every K] [--compute-ms MS] [--straggler RANK:FACTOR]\n"
            "         [--kill RANK:STEP] [--features F] [--classes C] [--samples S] [--eval-samples E]\n"
            "         [--batch B] [--seed S] [--transport mpi|ucx] [--no-mpi] [--json FILE]\n"
            "Parameters: C x (F + 1) floats. --kill needs a launch without mpirun (--no-mpi, GRADCOMM_RANK),\n"
            "since mpirun ends the whole job when a rank dies.\n");
      }
      bench::finalizeMpiIfUp();
      return 0;
    } else {
      die("unknown option '" + k + "' (try --help)");
    }
  }
  std::vector<std::string> modes;
  if (a.mode == "both") modes = {"allreduce", "gossip"};
  else if (a.mode == "allreduce" || a.mode == "gossip") modes = {a.mode};
  else die("unknown --mode '" + a.mode + "'; valid: allreduce, gossip, both");
  if (!a.transport.empty() && a.transport != "mpi" && a.transport != "ucx") {
    die("unknown --transport '" + a.transport + "'; valid: mpi, ucx");
  }
  if (a.killRank >= 0 && useMpi) {
    die("--kill needs a launch without mpirun (--no-mpi or GRADCOMM_RANK): mpirun ends the whole job when a rank dies");
  }
  if (a.killRank == 0) die("--kill: rank 0 writes the results, kill another rank");
  if (a.killRank >= 0 && modes.size() > 1) die("--kill: run one --mode at a time (the killed rank is gone for the next)");
  std::unique_ptr<Communicator> comm;
  try {
    comm = std::make_unique<Communicator>(bench::makeCommunicator(useMpi, a.transport));
  } catch (const Error& e) {
    std::fprintf(stderr, "gradcomm-gossip-bench: rank %d: %s\n", gRank, e.what());
    bench::finalizeMpiIfUp();
    return 2;
  }
  gRank = comm->rank();
  const int size = comm->size();
  if (a.stragglerRank >= size) die("--straggler: rank " + std::to_string(a.stragglerRank) + " does not exist");
  if (a.killRank >= size) die("--kill: rank " + std::to_string(a.killRank) + " does not exist");
  if (gRank == 0 && !a.json.empty()) {
    const std::string why = bench::unwritable(a.json);
    if (!why.empty()) {
      // Every rank must leave: tell them through a collective below.
      std::fprintf(stderr, "gradcomm-gossip-bench: --json: %s\n", why.c_str());
    }
  }
  {
    int32_t ok = (gRank != 0 || a.json.empty() || bench::unwritable(a.json).empty()) ? 1 : 0, all = 0;
    comm->allreduce(&ok, &all, 1, DataType::kInt32, ReduceOp::kMin).wait();
    if (!all) {
      comm.reset();
      bench::finalizeMpiIfUp();
      return 2;
    }
  }
  const int hosts = bench::countHosts(*comm);
  const bench::SoftmaxProblem probe(a.spec, 0);
  if (gRank == 0) {
    std::printf("# gradcomm-gossip-bench: %d ranks on %d host%s over %s, %zu parameters (%.2f MB), batch %zu, "
                "%d steps, lr %g%s, straggler %s%s\n",
                size, hosts, hosts == 1 ? "" : "s", comm->transportName().c_str(), probe.paramCount(),
                probe.paramCount() * 4 / 1e6, a.spec.batch, a.steps, a.lr, a.cosine ? " (cosine)" : "", stragglerText(a).c_str(),
                a.killRank >= 0 ? (", rank " + std::to_string(a.killRank) + " killed at step " +
                                   std::to_string(a.killStep)).c_str()
                                : "");
    std::printf("# %-9s %6s %10s %12s %11s %11s %10s %s\n", "mode", "steps", "train_s", "target_s", "final_loss",
                "steps/s", "consensus", "compute_ms comm_ms notes");
    std::fflush(stdout);
  }
  std::ostringstream rows;
  for (size_t m = 0; m < modes.size(); ++m) {
    Result r;
    try {
      r = run(*comm, a, modes[m]);
    } catch (const Error& e) {  // set-up failed (a communicator that failed in the previous mode)
      r.mode = modes[m];
      r.error = e.what();
    }
    const double myRate = r.trainSeconds > 0 ? r.stepsDone / r.trainSeconds : 0;
    double timeToTarget = r.timeToTarget, rate = myRate, rateMin = myRate, finalLoss = r.finalLoss;
    std::vector<double> rates(static_cast<size_t>(size), -1);
    rates[static_cast<size_t>(gRank)] = myRate;
    const bool collectives = a.killRank < 0;
    if (collectives) {
      try {
        // The run's numbers over every rank: the last rank's time to target
        // (-1 if some rank never reached it), mean and slowest steps/s.
        double mine[3] = {r.timeToTarget < 0 ? 1e300 : r.timeToTarget, -myRate, myRate}, all[3] = {0, 0, 0};
        comm->allreduce(mine, all, 1, DataType::kFloat64, ReduceOp::kMax).wait();
        comm->allreduce(mine + 1, all + 1, 1, DataType::kFloat64, ReduceOp::kMax).wait();
        comm->allreduce(mine + 2, all + 2, 1, DataType::kFloat64, ReduceOp::kAvg).wait();
        timeToTarget = all[0] >= 1e300 ? -1 : all[0];
        rateMin = -all[1];
        rate = all[2];
        comm->allgather(&myRate, rates.data(), 1, DataType::kFloat64).wait();
      } catch (const Error& e) {
        // A failed communicator: this rank's own numbers.
        if (r.error.empty()) r.error = e.what();
      }
    }
    std::string notes;
    if (!r.error.empty()) notes += "stopped with an error: " + r.error;
    if (!r.gossip.removedPeers.empty()) {
      notes += "removed ranks:";
      for (int p : r.gossip.removedPeers) notes += " " + std::to_string(p);
      notes += " (own model, not averaged)";
    }
    if (gRank == 0) {
      std::printf("  %-9s %6d %10.3f %12.3f %11.5f %11.2f %10.2e %10.2f %7.2f %s\n", r.mode.c_str(), r.stepsDone,
                  r.trainSeconds,
                  timeToTarget, finalLoss, rate, r.consensus, r.computeMs, r.commMs, notes.c_str());
      if (r.mode == "gossip") {
        std::printf("  # gossip on rank 0: sent %zu, mixed %zu (late %zu), dropped %zu, failed %zu\n", r.gossip.sent,
                    r.gossip.received, r.gossip.late, r.gossip.dropped, r.gossip.failed);
      }
      std::fflush(stdout);
      rows << (m ? ",\n" : "") << "  {\"mode\": \"" << r.mode << "\", \"ranks\": " << size << ", \"hosts\": " << hosts
           << ", \"straggler\": \"" << stragglerText(a) << "\", \"steps\": " << r.stepsDone
           << ", \"time_to_target_s\": " << timeToTarget << ", \"final_loss\": " << finalLoss
           << ", \"steps_per_s\": " << rate << ", \"steps_per_s_min\": " << rateMin << ", \"steps_per_s_per_rank\": [";
      for (size_t i = 0; i < rates.size(); ++i) rows << (i ? ", " : "") << rates[i];
      rows << "], \"target_loss\": " << a.targetLoss << ", \"consensus_distance\": " << r.consensus
           << ", \"compute_ms\": " << r.computeMs << ", \"comm_ms\": " << r.commMs
           << ", \"params\": " << probe.paramCount() << ", \"transport\": \"" << comm->transportName()
           << "\", \"killed\": " << (a.killRank >= 0 ? "\"" + std::to_string(a.killRank) + ":" + std::to_string(a.killStep) + "\"" : "null")
           << ", \"error\": " << (r.error.empty() ? std::string("null") : jsonString(r.error))
           << ", \"gossip_dropped\": " << r.gossip.dropped << ", \"gossip_late\": " << r.gossip.late
           << ", \"removed\": [";
      for (size_t i = 0; i < r.gossip.removedPeers.size(); ++i) rows << (i ? ", " : "") << r.gossip.removedPeers[i];
      rows << "]}";
    }
    if (!r.error.empty()) {
      std::fprintf(stderr, "gradcomm-gossip-bench: rank %d: %s stopped with an error: %s\n", gRank, r.mode.c_str(),
                   r.error.c_str());
    }
  }
  int rc = 0;
  if (gRank == 0 && !a.json.empty()) {
    std::ofstream f(a.json);
    f << "{\"results\": [\n" << rows.str() << "\n]}\n";
    f.close();
    if (!f) {
      std::fprintf(stderr, "gradcomm-gossip-bench: could not write the results to '%s'\n", a.json.c_str());
      rc = 2;
    }
  }
  if (a.killRank >= 0) {
    // A dead peer: the communicator cannot be torn down cleanly, and the
    // survivors' results are already out. Linger a moment first: a survivor
    // that exits while a slower one still gossips would look dead to it.
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::_Exit(rc);
  }
  comm.reset();
  bench::finalizeMpiIfUp();
  return rc;
}
