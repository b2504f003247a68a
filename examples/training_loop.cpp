// A data-parallel training loop's communication, the way a framework uses
// gradcomm: start an asynchronous allreduce of each layer's gradients as soon
// as they exist, keep computing, and wait only before the optimizer step.
//
//   mpirun -np 2 ./training_loop                    over MPI
//   mpirun -np 2 ./training_loop --transport ucx    never initialises MPI
//   GRADCOMM_RANK=0 GRADCOMM_WORLD_SIZE=2 GRADCOMM_RENDEZVOUS=127.0.0.1:29400 ./training_loop &
//   GRADCOMM_RANK=1 GRADCOMM_WORLD_SIZE=2 GRADCOMM_RENDEZVOUS=127.0.0.1:29400 ./training_loop
#include <gradcomm/gradcomm.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  // Without MPI when asked to, or when a launcher other than mpirun set
  // the rank (GRADCOMM_RANK, or torchrun's RANK).
  bool mpi = !std::getenv("GRADCOMM_RANK") && !(std::getenv("RANK") && !std::getenv("OMPI_COMM_WORLD_RANK"));
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--transport") == 0 && i + 1 < argc) {
      mpi = std::strcmp(argv[++i], "mpi") == 0;
    } else {
      std::fprintf(stderr, "usage: training_loop [--transport mpi|ucx]\n");
      return 2;
    }
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    // Over MPI_COMM_WORLD (initialises MPI if needed), or formed from the
    // launcher's environment through a TCP store, with bytes over UCX.
    gradcomm::Communicator comm = mpi ? gradcomm::Communicator() : gradcomm::communicatorFromEnvironment();
    const double formedMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (comm.rank() == 0) {
      std::printf("communicator of %d ranks over %s formed in %.1f ms\n", comm.size(), comm.transportName().c_str(),
                  formedMs);
    }
    const int layers = 4;
    std::vector<std::vector<float>> grads(layers);
    for (int l = 0; l < layers; ++l) grads[l].assign(static_cast<size_t>(1000 * (l + 1)), 0.0f);

    for (int step = 0; step < 3; ++step) {
      std::vector<gradcomm::Work> pending;
      // Backward pass: the last layer's gradients are ready first.
      for (int l = layers - 1; l >= 0; --l) {
        for (auto& g : grads[l]) g = static_cast<float>(comm.rank() + 1);  // "compute"
        pending.push_back(comm.allreduce(grads[l].data(), grads[l].data(), grads[l].size(),
                                         gradcomm::DataType::kFloat32, gradcomm::ReduceOp::kAvg));
      }
      for (auto& w : pending) w.wait();  // before the optimizer step
      const float want = (comm.size() + 1) / 2.0f;  // average of 1..size
      for (const auto& g : grads) {
        for (float v : g) {
          if (std::fabs(v - want) > 1e-6f) {
            std::fprintf(stderr, "rank %d: wrong average %f (want %f)\n", comm.rank(), v, want);
            return 1;
          }
        }
      }
      if (comm.rank() == 0) std::printf("step %d: gradients averaged over %d ranks\n", step, comm.size());
    }
  } catch (const gradcomm::Error& e) {
    std::fprintf(stderr, "gradcomm error: %s\n", e.what());
    return 1;
  }
  return 0;
}
