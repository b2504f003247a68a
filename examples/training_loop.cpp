// A data-parallel training loop's communication, the way a framework uses
// gradcomm: start an asynchronous allreduce of each layer's gradients as soon
// as they exist, keep computing, and wait only before the optimizer step.
//
//   mpirun -np 2 ./training_loop
#include <gradcomm/gradcomm.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  try {
    gradcomm::Communicator comm;  // over MPI_COMM_WORLD; initialises MPI if needed
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
