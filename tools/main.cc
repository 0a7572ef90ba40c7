#include <pthread.h>

#include <cstdio>
#include <filesystem>
#include <new>
#include <string>

#include "core/try.h"
#include "kernels/cpu/int8_kernel.h"
#include "kernels/q4.h"
#include "serve/http.h"
#include "tools/commands.h"
#include "tools/fault_env.h"

namespace tessera::tools {

int& exit_code() {
  static int code = kExitOk;
  return code;
}

sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

void add_http_limit_options(CLI::App* cmd, serve::DoorLimits* d) {
  cmd->add_option("--header-timeout", d->header_timeout_s,
                  "seconds a connection (or a keep-alive request, from its first byte) has to send all its headers")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--idle-timeout", d->idle_timeout_s, "seconds a keep-alive connection may wait without a request")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--max-connections", d->max_connections, "connections open at once; more get a fast 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-connections-per-client", d->max_per_client,
                  "connections open at once from one client address; more get a fast 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

void add_int8_kernel_option(CLI::App* cmd, std::string* name) {
  cmd->add_option("--int8-kernel", *name,
                  "INT8 matmul kernel: auto (the fastest exact one), avx2, vnni, onednn or generic; a kernel that "
                  "is wrong on this CPU fails the INT8 self-check")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "avx2", "vnni", "onednn", "generic"}));
}

Status apply_int8_kernel(const std::string& name) {
  ASSIGN_OR_RETURN(cpu::Int8Kernel k, cpu::parse_int8_kernel(name));
  return cpu::set_int8_kernel(k).With("--int8-kernel");
}

int fail(const Status& st) {
  std::fprintf(stderr, "tessera: error: %s\n", st.message().c_str());
  return kExitError;
}

}  // namespace tessera::tools

int main(int argc, char** argv) {
  using namespace tessera::tools;
  apply_kernel_choices_from_env();
  CLI::App app{"Tessera: train and serve GPT models on CPU or GPU clusters", "tessera"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera " TESSERA_VERSION);
  add_info_command(app);
  add_eval_command(app);
  add_bench_command(app);
  add_train_command(app);
  add_prepare_command(app);
  add_launch_command(app);
  add_elastic_command(app);
  add_sample_command(app);
  add_serve_command(app);
  add_quantize_command(app);
  add_route_command(app);
  add_dashboard_command(app);
  add_report_command(app);
  add_registry_commands(app);
  add_trace_command(app);
  add_checkpoint_commands(app);
  add_doctor_command(app);
  add_plan_command(app);
  add_synth_command(app);
  add_tokenize_command(app);
  // CLI11 would say only "A subcommand is required"; name the word instead.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "tessera: error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, not CLI11's two.
    std::fprintf(stderr, "tessera: error: %s (see --help)\n", e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    // The safety net (the commands run inside parse()): errors are Status
    // values, but an allocation or a std::filesystem call that throws must
    // still end as one line and exit 1, not std::terminate (exit 134).
    std::fprintf(stderr, "tessera: error: out of memory (std::bad_alloc)\n");
    return kExitError;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    return kExitError;
  }
  return exit_code();
}
