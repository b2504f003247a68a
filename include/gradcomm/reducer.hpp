#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradcomm/communicator.hpp"
#include "gradcomm/export.hpp"
#include "gradcomm/types.hpp"

namespace gradcomm {

namespace detail {
class ReducerImpl;
}

/// One gradient the Reducer synchronises: its size and type, and where it
/// lives (ignored with gradient-as-bucket-view, where the Reducer owns it).
struct GradientSpec {
  size_t count = 0;
  DataType type = DataType::kFloat32;
  void* data = nullptr;
};

/// Reducer settings. Sizes of 0 (and an empty string) take the value of the
/// matching GRADCOMM_* parameter.
struct ReducerOptions {
  size_t bucketCapBytes = 0;    ///< GRADCOMM_BUCKET_CAP (25M)
  size_t firstBucketBytes = 0;  ///< GRADCOMM_FIRST_BUCKET (1M)
  /// Send each bucket as allreduces of at most this many bytes, each
  /// launched as soon as the gradients it covers are ready; SIZE_MAX: whole
  /// buckets; 0: GRADCOMM_PARTITION_SIZE (4M).
  size_t partitionBytes = 0;
  /// Divide by the number of ranks (floating-point buckets; integer buckets are summed).
  bool average = true;
  /// The caller computes each gradient straight into bucket memory
  /// (Reducer::gradient(i)) instead of the Reducer copying it in and out.
  bool gradientAsBucketView = false;
  /// After the first synchronised step, re-pack buckets in the order
  /// gradients actually became ready (rank 0's order, broadcast).
  bool rebuildBuckets = true;
  /// Force an allreduce algorithm for the buckets ("" = the selector's choice).
  std::string algorithm;
  /// Compression of float32 buckets ("" = GRADCOMM_COMPRESSION; see
  /// CollectiveOptions::compression). Each bucket keeps its own error
  /// feedback, carried over when buckets are rebuilt.
  std::string compression;
  /// Chrome trace of this rank ("" = GRADCOMM_TIMELINE; the rank number is
  /// inserted before ".json", or appended).
  std::string timelinePath;
  /// Device (CUDA) gradients: the cudaStream_t they are produced on. Each
  /// markReady() orders the gradient's copy into its bucket after the work
  /// queued on it so far, and finalize() orders the work queued on it
  /// afterwards after the copies back (null: the legacy default stream).
  void* stream = nullptr;
  /// With gradientAsBucketView: the device of the buckets (-1: host
  /// memory). Without it, buckets live where the gradients do (all on the
  /// host, or all on one device).
  int device = -1;
  /// Print statistics to stderr every step, on rank 0 (GRADCOMM_STATS=N: every
  /// Nth step instead; GRADCOMM_STATS_ALL_RANKS=1: on every rank).
  bool printStats = false;
};

/// Where the time of one step went. A step runs from the end of one
/// finalize() to the end of the next (from the first markReady() for the
/// first step).
struct StepStats {
  uint64_t step = 0;
  double stepMs = 0;         ///< wall time of the step
  double commMs = 0;         ///< summed duration of the step's bucket allreduces
  double exposedMs = 0;      ///< time the caller was blocked in finalize()
  double hiddenMs = 0;       ///< communication that overlapped computation
  double computeMs = 0;      ///< stepMs - exposedMs
  double utilization = 0;    ///< computeMs / stepMs
  size_t buckets = 0;        ///< allreduces launched
  double lastBucketMs = 0;   ///< the last bucket's allreduces (all its partitions): the tail no overlap can hide
  size_t bytes = 0;          ///< bytes allreduced
  bool synchronized = true;  ///< false for a step with synchronisation off
};

/// Bucketed allreduce of gradients, overlapped with the backward pass.
/// Gradients are packed into buckets (a small first bucket, then up to the
/// cap) in the order they are expected to become ready; markReady(i) as
/// each gradient is produced launches every bucket that is complete and
/// whose predecessors have been launched, so all ranks launch in the same
/// order; finalize() waits and leaves the (averaged) gradients in place.
///
/// Construction is collective and checks that every rank registered the
/// same gradients. Misuse (a second markReady of a gradient in one step, a
/// gradient never marked ready) throws on the rank that made it and aborts
/// the communicator, so the other ranks fail instead of waiting.
class GRADCOMM_API Reducer {
 public:
  Reducer(Communicator comm, std::vector<GradientSpec> gradients, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Memory of gradient i: bucket memory with gradient-as-bucket-view (it
  /// moves when buckets are rebuilt after the first step: ask again each
  /// step), else the caller's pointer.
  void* gradient(size_t i);
  /// Gradient i of this step is complete.
  void markReady(size_t i);
  /// Gradient i takes no part in this step (its contribution is zero).
  void markUnused(size_t i);
  /// Waits for every bucket and leaves the result in each gradient's
  /// memory. Throws, naming them, if some gradients were never marked.
  void finalize();
  /// With synchronisation off (like DDP's no_sync) steps do not
  /// communicate: the caller accumulates, and the next synchronised step
  /// allreduces the accumulated gradients.
  void setSynchronization(bool enabled);
  /// Statistics of the last finished step.
  StepStats lastStepStats() const;
  /// Gradient indices of each bucket, in launch order.
  std::vector<std::vector<size_t>> buckets() const;

 private:
  std::unique_ptr<detail::ReducerImpl> impl_;
};

}  // namespace gradcomm
