// The fault plan (core/fault_plan.h): what each variable parses to, one
// error line for a value not understood, and that library code takes faults
// only from a plan it is given: with every old variable set and no plan, a
// training run with checkpoints and a rendezvous fault point behave as if
// none were set.
#include "core/fault_plan.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"
#include "comm/local/self_communicator.h"
#include "elastic/rendezvous.h"
#include "train/tiny_train.h"
#include "train/trainer.h"

namespace tessera {
namespace {

Result<FaultPlan> parse(const std::map<std::string, std::string>& vars) {
  return fault_plan_from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(FaultPlan, NothingSetIsNoFault) {
  Result<FaultPlan> p = parse({});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->step_fault, FaultPlan::StepFault::kNone);
  EXPECT_EQ(p->ckpt_errno_for(0), 0);
  EXPECT_TRUE(p->elastic_point.empty());
  EXPECT_EQ(p->stop_at_start_rank, -1);
  EXPECT_FALSE(p->trace_ping_every_rank);
  EXPECT_TRUE(inject_step_fault(&*p, 0, 0).ok());
  EXPECT_TRUE(inject_step_fault(nullptr, 0, 0).ok());
}

TEST(FaultPlan, EachVariableParses) {
  Result<FaultPlan> p = parse({{"TESSERA_FAULT", "exit@2:5"},
                               {"TESSERA_CKPT_FAULT", "enospc@3"},
                               {"TESSERA_ELASTIC_FAULT", "rdzv-leader@4"},
                               {"TESSERA_TEST_STOP_AT_START", "1"},
                               {"TESSERA_TRACE_PING", "1"}});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->step_fault, FaultPlan::StepFault::kExit);
  EXPECT_EQ(p->step_rank, 2);
  EXPECT_EQ(p->step, 5);
  EXPECT_EQ(p->ckpt_errno_for(3), ENOSPC);
  EXPECT_EQ(p->ckpt_errno_for(0), 0);
  EXPECT_EQ(p->elastic_point, "rdzv-leader");
  EXPECT_EQ(p->elastic_epoch, 4);
  EXPECT_EQ(p->stop_at_start_rank, 1);
  EXPECT_TRUE(p->trace_ping_every_rank);

  Result<FaultPlan> every = parse({{"TESSERA_CKPT_FAULT", "eio"}, {"TESSERA_FAULT", "stall@0:1"}});
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->ckpt_errno_for(5), EIO);
  EXPECT_EQ(every->step_fault, FaultPlan::StepFault::kStall);
}

TEST(FaultPlan, ARestartedElasticWorkerHasNoElasticFault) {
  Result<FaultPlan> p = parse({{"TESSERA_ELASTIC_FAULT", "rdzv@1"}, {"TESSERA_ELASTIC_RESTART", "2"}});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->elastic_point.empty());
  Result<FaultPlan> first = parse({{"TESSERA_ELASTIC_FAULT", "rdzv@1"}, {"TESSERA_ELASTIC_RESTART", "0"}});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->elastic_point, "rdzv");
}

TEST(FaultPlan, AValueNotUnderstoodIsOneLineNamingTheVariable) {
  for (const auto& [var, value] : std::map<std::string, std::string>{{"TESSERA_FAULT", "exit@x:1"},
                                                                     {"TESSERA_CKPT_FAULT", "eio@x"},
                                                                     {"TESSERA_ELASTIC_FAULT", "nowhere@1"},
                                                                     {"TESSERA_TEST_STOP_AT_START", "-1"},
                                                                     {"TESSERA_TRACE_PING", "yes"}}) {
    Result<FaultPlan> p = parse({{var, value}});
    ASSERT_FALSE(p.ok()) << var;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(p.status().message().rfind(var + "='" + value + "': want ", 0), 0u) << p.status().message();
    EXPECT_EQ(p.status().message().find('\n'), std::string::npos);
  }
}

TEST(FaultPlan, AnExitWithoutTheHookIsAnErrorNotAnExit) {
  Result<FaultPlan> p = parse({{"TESSERA_FAULT", "exit@0:3"}});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(inject_step_fault(&*p, 0, 2).ok());
  EXPECT_TRUE(inject_step_fault(&*p, 1, 3).ok());
  Status s = inject_step_fault(&*p, 0, 3);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  int exited = -1;
  p->exit = [&](int status) { exited = status; };
  (void)inject_step_fault(&*p, 0, 3);
  EXPECT_EQ(exited, 3);
}

TEST(FaultPlan, TheOldVariablesAloneChangeNothing) {
  const std::map<std::string, std::string> old = {{"TESSERA_FAULT", "exit@0:1"},
                                                  {"TESSERA_CKPT_FAULT", "eio"},
                                                  {"TESSERA_ELASTIC_FAULT", "rdzv@0"},
                                                  {"TESSERA_ELASTIC_RESTART", "0"},
                                                  {"TESSERA_TEST_STOP_AT_START", "0"},
                                                  {"TESSERA_TRACE_PING", "1"}};
  for (const auto& [k, v] : old) setenv(k.c_str(), v.c_str(), 1);
  TrainConfig c = testing_util::tiny_train_config("fault_plan_test", 3);
  const std::string dir = c.checkpoint_dir;
  c.checkpoint_every = 1;
  auto world = comm::self_communicator();
  // No plan: no exit at step 1 (the process would be gone), no failing
  // checkpoint write.
  Result<TrainSummary> r = run_training(c, *world, nullptr);
  // No plan: the rendezvous fault point does nothing (it would SIGKILL).
  elastic::fault_point(nullptr, "rdzv", 0);
  for (const auto& [k, v] : old) unsetenv(k.c_str());
  ASSERT_TRUE(r.ok()) << r.status().message();
  Result<ckpt::Checkpoint> ck = ckpt::Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ(ck->step(), 3);
  EXPECT_TRUE(ck->verify().ok());
}

TEST(FaultPlan, APlanGivenToTheTrainerIsHonoured) {
  TrainConfig c = testing_util::tiny_train_config("fault_plan_given", 3);
  const std::string dir = c.checkpoint_dir;
  FaultPlan plan;
  plan.step_fault = FaultPlan::StepFault::kExit;
  plan.step_rank = 0;
  plan.step = 1;
  auto world = comm::self_communicator();
  Result<TrainSummary> r = run_training(c, *world, nullptr, nullptr, nullptr, &plan);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("test fault: exit at step 1 on rank 0"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace tessera
