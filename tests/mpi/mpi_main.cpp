// main() of the MPI test binaries: the caller initialises MPI (gradcomm
// must not finalise it), every rank runs the same tests in the same order,
// and each rank leaves a PASS/FAIL marker for scripts/mpirun-test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {
// Non-zero ranks print only their failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    // Only rank 0 prints progress; failures still print on every rank.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int result = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (const char* dir = std::getenv("GRADCOMM_TEST_MARKER_DIR")) {
    std::string path = std::string(dir) + "/rank" + std::to_string(rank);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(result == 0 ? "PASS" : "FAIL", f);
      std::fclose(f);
    }
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    std::fprintf(stderr, "rank %d: MPI was finalised by someone other than its initialiser\n", rank);
    return 1;
  }
  MPI_Finalize();
  return any;
}
