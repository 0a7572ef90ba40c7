// main() of tessera_mpi_tests: MPI up, the world communicator, GoogleTest,
// and one exit status for the whole job (non-zero if any rank failed).
// Rank 0 prints GoogleTest's usual report; other ranks print only their
// failures, each line prefixed with the rank.
#include <cstdio>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "comm/mpi/mpi_communicator.h"
#include "mpi_test_env.h"

namespace tessera::comm::mpi_test {

namespace {
Communicator* g_world = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (Not UnitTest::current_test_info() in OnTestPartResult: GoogleTest holds
  // the lock it takes there.)
  void OnTestStart(const ::testing::TestInfo& t) override { test_ = std::string(t.test_suite_name()) + "." + t.name(); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(), r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

Communicator& test_world() { return *g_world; }

}  // namespace tessera::comm::mpi_test

int main(int argc, char** argv) {
  using namespace tessera::comm;
  ::testing::InitGoogleTest(&argc, argv);
  CommOptions options;
  options.timeout = mpi_test::kTestTimeout;
  auto world = mpi_world(options);
  if (!world.ok()) {
    std::fprintf(stderr, "tessera_mpi_tests: %s\n", world.status().message().c_str());
    return 1;
  }
  mpi_test::g_world = world->get();
  const int rank = (*world)->rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new mpi_test::RankFailurePrinter(rank));

  const int failed_here = RUN_ALL_TESTS() != 0;
  int32_t failed_anywhere = failed_here;
  tessera::Status st = (*world)->all_reduce(&failed_anywhere, &failed_anywhere, 1, ElemType::kI32, ReduceOp::kMax);
  if (!st.ok()) std::fprintf(stderr, "[rank %d] %s\n", rank, st.message().c_str());
  if (rank == 0 && failed_anywhere && !failed_here) std::fprintf(stderr, "FAILED on another rank (see above)\n");
  world->reset();
  mpi_finalize();
  return failed_anywhere || !st.ok() ? 1 : 0;
}
