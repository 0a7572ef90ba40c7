// The `tessera` command line: each file registers one subcommand. Commands
// report errors as one "tessera: error: ..." line on stderr; only main()
// turns the returned code into the process exit status.
#pragma once

#include <signal.h>

#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "nn/gpt.h"

namespace tessera::serve {
struct DoorLimits;
}  // namespace tessera::serve

namespace tessera::tools {

// Exit codes.
constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // the job failed (bad input, I/O, ...)
constexpr int kExitUsage = 2;  // bad command line
// `tessera train` stopped by SIGUSR1 or SIGTERM after publishing and
// verifying a checkpoint (train/stop.h): requeue and --resume. EX_TEMPFAIL.
constexpr int kExitRequeue = 75;

// Where a subcommand stores its result for main().
int& exit_code();
// Prints "tessera: error: <message>" and returns kExitError.
int fail(const Status& st);
// Blocks SIGTERM and SIGINT in this thread (and the threads it starts from
// now on, which inherit the mask) and returns the set, for one thread of a
// long-running command (serve, route, dashboard) to sigwait() on.
sigset_t block_stop_signals();

// --int8-kernel on the commands that run the INT8 tier (serve, sample, bench
// decode): auto, or one kernel forced (kernels/cpu/int8_kernel.h) for
// benchmarks and the self-check's tests. apply_int8_kernel sets it.
void add_int8_kernel_option(CLI::App* cmd, std::string* name);
Status apply_int8_kernel(const std::string& name);

// The HTTP front end's limits on `serve` and `route` (serve/http.h):
// --header-timeout, --idle-timeout, --max-connections,
// --max-connections-per-client.
void add_http_limit_options(CLI::App* cmd, serve::DoorLimits* limits);

void add_info_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_bench_comm_commands(CLI::App& bench);  // under `bench`: allreduce, all_gather, ...
void add_bench_p2p_command(CLI::App& bench);    // under `bench`: p2p
void add_bench_decode_command(CLI::App& bench);  // under `bench`: decode (cmd_bench_decode.cc)
void add_bench_serve_command(CLI::App& bench);   // under `bench`: serve (cmd_bench_serve.cc)
void add_train_command(CLI::App& app);
void add_prepare_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_elastic_command(CLI::App& app);     // cmd_elastic.cc
void add_sample_command(CLI::App& app);
void add_checkpoint_commands(CLI::App& app);  // export, checkpoint verify
void add_serve_command(CLI::App& app);        // cmd_serve.cc
void add_quantize_command(CLI::App& app);     // cmd_quantize.cc
void add_route_command(CLI::App& app);        // cmd_route.cc
void add_dashboard_command(CLI::App& app);    // cmd_dashboard.cc
void add_report_command(CLI::App& app);       // cmd_dashboard.cc: report
void add_registry_commands(CLI::App& app);    // cmd_registry.cc: registry add, list, show, promote, rm
void add_trace_command(CLI::App& app);        // cmd_trace.cc: trace merge
void add_doctor_command(CLI::App& app);       // cmd_doctor.cc: doctor
void add_plan_command(CLI::App& app);         // cmd_plan.cc
void add_synth_command(CLI::App& app);        // cmd_synth.cc: synth clicks
void add_tokenize_command(CLI::App& app);     // cmd_tokenize.cc: tokenize
void add_bench_dlrm_command(CLI::App& bench);  // under `bench`: dlrm (cmd_synth.cc)
void add_bench_dlrm_parallel_command(CLI::App& bench);  // under `bench`: dlrm-parallel (cmd_bench_dlrm.cc)
void add_bench_dlrm_ops_command(CLI::App& bench);  // under `bench`: dlrm-ops (cmd_bench_dlrm_ops.cc)

}  // namespace tessera::tools
