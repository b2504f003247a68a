// Data-parallel training of a real (small) model with gradcomm::Reducer: a
// two-layer perceptron learns a linear decision boundary on synthetic data.
// Each rank draws its own samples; backward computes the output layer's
// gradients first and marks them ready at once, so their allreduce overlaps
// with the hidden layer's backward; finalize() leaves the gradients averaged
// over the ranks, and every rank takes the same SGD step.
//
//   mpirun -np 2 ./reducer_loop
//
// It checks what data parallelism promises: the loss (averaged over ranks)
// falls, and the ranks' parameters stay bitwise identical.
#include <gradcomm/gradcomm.hpp>
#include <gradcomm/reducer.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr size_t kInputs = 16;
constexpr size_t kHidden = 32;
constexpr size_t kBatch = 256;

/// Parameters and their gradients, one buffer per tensor, in registration
/// order: hidden weights, hidden bias, output weights, output bias.
struct Mlp {
  std::vector<float> w1 = std::vector<float>(kHidden * kInputs), b1 = std::vector<float>(kHidden);
  std::vector<float> w2 = std::vector<float>(kHidden), b2 = std::vector<float>(1);
  std::vector<float> gw1 = w1, gb1 = b1, gw2 = w2, gb2 = b2;

  enum Tensor : size_t { kW1, kB1, kW2, kB2 };
  std::vector<std::vector<float>*> params() { return {&w1, &b1, &w2, &b2}; }
  std::vector<std::vector<float>*> grads() { return {&gw1, &gb1, &gw2, &gb2}; }
};

/// One step of forward and backward on a batch; returns the mean loss.
/// `ready(i)` is called as soon as gradient i is complete.
template <typename Ready>
float forwardBackward(Mlp& m, const std::vector<float>& x, const std::vector<float>& y, Ready ready) {
  std::vector<float> h(kBatch * kHidden), dz(kBatch);
  float loss = 0;
  for (size_t n = 0; n < kBatch; ++n) {
    float z = m.b2[0];
    for (size_t j = 0; j < kHidden; ++j) {
      float a = m.b1[j];
      for (size_t i = 0; i < kInputs; ++i) a += m.w1[j * kInputs + i] * x[n * kInputs + i];
      h[n * kHidden + j] = std::tanh(a);
      z += m.w2[j] * h[n * kHidden + j];
    }
    const float p = 1.0f / (1.0f + std::exp(-z));
    loss -= y[n] * std::log(p + 1e-7f) + (1 - y[n]) * std::log(1 - p + 1e-7f);
    dz[n] = (p - y[n]) / kBatch;
  }
  // Output layer first: its gradients can travel while the rest is computed.
  std::fill(m.gw2.begin(), m.gw2.end(), 0.0f);
  m.gb2[0] = 0;
  for (size_t n = 0; n < kBatch; ++n) {
    for (size_t j = 0; j < kHidden; ++j) m.gw2[j] += dz[n] * h[n * kHidden + j];
    m.gb2[0] += dz[n];
  }
  ready(Mlp::kB2);
  ready(Mlp::kW2);
  std::fill(m.gw1.begin(), m.gw1.end(), 0.0f);
  std::fill(m.gb1.begin(), m.gb1.end(), 0.0f);
  for (size_t n = 0; n < kBatch; ++n) {
    for (size_t j = 0; j < kHidden; ++j) {
      const float hj = h[n * kHidden + j];
      const float da = dz[n] * m.w2[j] * (1 - hj * hj);
      for (size_t i = 0; i < kInputs; ++i) m.gw1[j * kInputs + i] += da * x[n * kInputs + i];
      m.gb1[j] += da;
    }
  }
  ready(Mlp::kB1);
  ready(Mlp::kW1);
  return loss / kBatch;
}

}  // namespace

int main() {
  try {
    gradcomm::Communicator comm;  // MPI_COMM_WORLD
    const int rank = comm.rank(), size = comm.size();

    // The same initial parameters on every rank (one seed), different data.
    Mlp model;
    std::mt19937 init(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto* p : model.params()) {
      for (auto& v : *p) v = 0.3f * normal(init);
    }
    std::vector<float> truth(kInputs);
    for (auto& v : truth) v = normal(init);
    std::mt19937 data(1000 + static_cast<unsigned>(rank));

    std::vector<gradcomm::GradientSpec> specs;
    for (auto* g : model.grads()) specs.push_back({g->size(), gradcomm::DataType::kFloat32, g->data()});
    gradcomm::Reducer reducer(comm, specs);  // averages over the ranks

    const float learningRate = 0.5f;
    const int steps = 60;
    float firstLoss = 0, lastLoss = 0;
    std::vector<float> x(kBatch * kInputs), y(kBatch);
    for (int step = 0; step < steps; ++step) {
      for (size_t n = 0; n < kBatch; ++n) {
        float dot = 0;
        for (size_t i = 0; i < kInputs; ++i) dot += truth[i] * (x[n * kInputs + i] = normal(data));
        y[n] = dot > 0 ? 1.0f : 0.0f;
      }
      float loss = forwardBackward(model, x, y, [&](size_t i) { reducer.markReady(i); });
      reducer.finalize();  // gradients are now the average over the ranks
      for (size_t t = 0; t < model.params().size(); ++t) {
        auto& p = *model.params()[t];
        const auto& g = *model.grads()[t];
        for (size_t k = 0; k < p.size(); ++k) p[k] -= learningRate * g[k];
      }
      comm.allreduce(&loss, &loss, 1, gradcomm::DataType::kFloat32, gradcomm::ReduceOp::kAvg).wait();
      if (step == 0) firstLoss = loss;
      lastLoss = loss;
      if (rank == 0 && (step % 20 == 0 || step == steps - 1)) std::printf("step %d: loss %.4f\n", step, loss);
    }

    // In sync: every rank holds bitwise the same parameters.
    std::vector<float> all;
    for (auto* p : model.params()) all.insert(all.end(), p->begin(), p->end());
    std::vector<float> lo(all.size()), hi(all.size());
    comm.allreduce(all.data(), lo.data(), all.size(), gradcomm::DataType::kFloat32, gradcomm::ReduceOp::kMin).wait();
    comm.allreduce(all.data(), hi.data(), all.size(), gradcomm::DataType::kFloat32, gradcomm::ReduceOp::kMax).wait();
    if (lo != hi) {
      std::fprintf(stderr, "rank %d: parameters differ between ranks\n", rank);
      return 1;
    }
    if (!(lastLoss < 0.6f * firstLoss)) {
      std::fprintf(stderr, "rank %d: loss fell only from %.4f to %.4f\n", rank, firstLoss, lastLoss);
      return 1;
    }
    if (rank == 0) {
      std::printf("loss %.4f -> %.4f over %d steps; parameters identical on %d ranks\n", firstLoss, lastLoss, steps,
                  size);
    }
  } catch (const gradcomm::Error& e) {
    std::fprintf(stderr, "gradcomm error: %s\n", e.what());
    return 1;
  }
  return 0;
}
