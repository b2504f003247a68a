#pragma once
// The optimisation problem of gradcomm-gossip-bench (and of the test that
// checks gossip reaches synchronous SGD's loss): multinomial logistic
// regression on synthetic data. A random "teacher" matrix labels Gaussian
// features (with label noise, so the best loss is above zero); each rank
// owns its own shard; every rank evaluates on one shared held-out set.
// Parameters: classes x (features + 1) floats (weights and biases).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gradcomm::bench {

struct SoftmaxSpec {
  size_t features = 256;
  size_t classes = 16;
  size_t samplesPerRank = 4096;
  size_t evalSamples = 2048;
  size_t batch = 64;
  uint64_t seed = 1;
};

class SoftmaxProblem {
 public:
  SoftmaxProblem(const SoftmaxSpec& spec, int rank) : spec_(spec) {
    std::mt19937_64 teacherRng(spec.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    teacher_.resize(spec.classes * spec.features);
    for (auto& w : teacher_) w = normal(teacherRng) / std::sqrt(static_cast<float>(spec.features));
    makeSet(spec.seed * 7919 + 1 + static_cast<uint64_t>(rank), spec.samplesPerRank, x_, y_);
    makeSet(spec.seed * 7919, spec.evalSamples, evalX_, evalY_);
  }

  size_t paramCount() const { return spec_.classes * (spec_.features + 1); }

  /// Mean cross-entropy gradient of minibatch `step` (the shard's batches in
  /// turn) at `params`, written to `grad`; returns the minibatch loss.
  double gradient(const float* params, uint64_t step, float* grad) const {
    std::fill(grad, grad + paramCount(), 0.0f);
    const size_t n = spec_.samplesPerRank, b = std::min(spec_.batch, n);
    std::vector<float> p(spec_.classes);
    double loss = 0;
    for (size_t j = 0; j < b; ++j) {
      const size_t i = (step * b + j) % n;
      const float* xi = &x_[i * spec_.features];
      loss += probabilities(params, xi, y_[i], p.data());
      p[y_[i]] -= 1.0f;  // d loss / d logits
      for (size_t c = 0; c < spec_.classes; ++c) {
        const float g = p[c] / static_cast<float>(b);
        float* row = grad + c * (spec_.features + 1);
        for (size_t f = 0; f < spec_.features; ++f) row[f] += g * xi[f];
        row[spec_.features] += g;
      }
    }
    return loss / static_cast<double>(b);
  }

  /// Mean cross-entropy on the shared held-out set.
  double loss(const float* params) const {
    std::vector<float> p(spec_.classes);
    double total = 0;
    for (size_t i = 0; i < spec_.evalSamples; ++i) {
      total += probabilities(params, &evalX_[i * spec_.features], evalY_[i], p.data());
    }
    return total / static_cast<double>(spec_.evalSamples);
  }

 private:
  // Softmax of the logits into p; returns -log p[label].
  double probabilities(const float* params, const float* x, uint32_t label, float* p) const {
    float top = -INFINITY;
    for (size_t c = 0; c < spec_.classes; ++c) {
      const float* row = params + c * (spec_.features + 1);
      float z = row[spec_.features];
      for (size_t f = 0; f < spec_.features; ++f) z += row[f] * x[f];
      p[c] = z;
      top = std::max(top, z);
    }
    double sum = 0;
    for (size_t c = 0; c < spec_.classes; ++c) {
      p[c] = std::exp(p[c] - top);
      sum += p[c];
    }
    for (size_t c = 0; c < spec_.classes; ++c) p[c] = static_cast<float>(p[c] / sum);
    return -std::log(std::max(static_cast<double>(p[label]), 1e-30));
  }

  void makeSet(uint64_t seed, size_t n, std::vector<float>& x, std::vector<uint32_t>& y) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    x.resize(n * spec_.features);
    y.resize(n);
    for (size_t i = 0; i < n; ++i) {
      float* xi = &x[i * spec_.features];
      for (size_t f = 0; f < spec_.features; ++f) xi[f] = normal(rng);
      uint32_t best = 0;
      float bestScore = -INFINITY;
      for (size_t c = 0; c < spec_.classes; ++c) {
        float s = 0.5f * normal(rng);  // label noise
        for (size_t f = 0; f < spec_.features; ++f) s += teacher_[c * spec_.features + f] * xi[f];
        if (s > bestScore) {
          bestScore = s;
          best = static_cast<uint32_t>(c);
        }
      }
      y[i] = best;
    }
  }

  SoftmaxSpec spec_;
  std::vector<float> teacher_;
  std::vector<float> x_, evalX_;
  std::vector<uint32_t> y_, evalY_;
};

}  // namespace gradcomm::bench
