#include "tools/fault_env.h"

#include <signal.h>

#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "core/huge_pages.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/ops.h"

namespace tessera::tools {

Result<const FaultPlan*> process_fault_plan() {
  static const Result<FaultPlan> plan = [] {
    Result<FaultPlan> p = fault_plan_from_env([](const char* name) { return std::getenv(name); });
    if (p.ok()) {
      p->exit = [](int status) { std::_Exit(status); };
      p->kill = [] { ::raise(SIGKILL); };
    }
    return p;
  }();
  if (!plan.ok()) return plan.status();
  return &plan.value();
}

void stop_at_start_if_asked(const FaultPlan& plan) {
  if (plan.stop_at_start_rank < 0) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank != nullptr && std::atoi(rank) == plan.stop_at_start_rank) ::raise(SIGSTOP);
}

void apply_kernel_choices_from_env() {
  if (const char* a = std::getenv("TESSERA_CUDA_ATTENTION"); a != nullptr && *a != '\0') {
    if (std::strcmp(a, "plain") == 0) {
      cuda::set_attention_preference(cuda::AttentionImpl::kPlain);
    } else if (std::strcmp(a, "flash") != 0) {
      std::fprintf(stderr, "tessera: TESSERA_CUDA_ATTENTION=%s is neither 'flash' nor 'plain'; using flash\n", a);
    }
  }
  if (const char* v = std::getenv("TESSERA_VERBOSE_MATMUL"); v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0)
    cpu::set_verbose_matmul(true);
  // 0: the weights, arenas and read roof in 4 KiB pages (core/huge_pages.h).
  if (const char* v = std::getenv("TESSERA_HUGE_PAGES"); v != nullptr && std::strcmp(v, "0") == 0)
    set_huge_pages(false);
}

bool elastic_options_from_env(elastic::ElasticOptions* o) {
  const char* store = std::getenv("TESSERA_ELASTIC_STORE");
  if (!store || !*store) return false;
  Result<comm::StoreAddress> a = comm::parse_store_address(store);
  if (!a.ok()) return false;
  o->store = *a;
  auto num = [](const char* name, double dflt) {
    const char* v = std::getenv(name);
    return v ? std::atof(v) : dflt;
  };
  const char* job = std::getenv("TESSERA_ELASTIC_JOB");
  o->job = job ? job : "default";
  o->min = static_cast<int>(num("TESSERA_ELASTIC_MIN", 1));
  o->max = static_cast<int>(num("TESSERA_ELASTIC_MAX", 1));
  o->last_call_s = num("TESSERA_ELASTIC_LAST_CALL", 1.0);
  o->rdzv_timeout_s = num("TESSERA_ELASTIC_RDZV_TIMEOUT", 60.0);
  return true;
}

}  // namespace tessera::tools
