// tessera launch -n N [--hosts h1:s,h2:s] -- <tessera args>: runs this
// tessera binary under mpirun with the flags this machine needs, and prints
// the mpirun command first. Under srun, run `srun tessera train ...`
// directly instead (docs/launch.md).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct LaunchArgs {
  int ranks = 1;
  std::string hosts;  // "h1:slots,h2:slots"
  int threads = 0;    // OpenMP threads per rank; 0: cores / ranks per host
  bool dry_run = false;
  std::vector<std::string> args;  // after --
};

std::string self_path() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return "tessera";
  return std::string(buf.data(), n);
}

std::string quote(const std::string& s) {
  if (!s.empty() && s.find_first_of(" \t'\"$\\`*?;&|<>()") == std::string::npos) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int run_launch(const LaunchArgs& a) {
  if (a.args.empty()) return fail(Status::InvalidArgument("nothing to launch: give the tessera arguments after --"));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  int hosts = 1;
  if (!a.hosts.empty()) hosts = 1 + static_cast<int>(std::count(a.hosts.begin(), a.hosts.end(), ','));
  const int ranks_per_host = (a.ranks + hosts - 1) / hosts;
  const int threads = a.threads > 0 ? a.threads : std::max(1, cores / ranks_per_host);
  const bool oversubscribed = ranks_per_host * threads > cores;

  std::vector<std::string> cmd = {"mpirun"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"-np", std::to_string(a.ranks)});
  if (!a.hosts.empty()) cmd.insert(cmd.end(), {"--host", a.hosts});
  if (oversubscribed) {
    cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
  } else if (threads > 1) {
    cmd.insert(cmd.end(), {"--map-by", "slot:PE=" + std::to_string(threads), "--bind-to", "core"});
  } else {
    cmd.insert(cmd.end(), {"--bind-to", "core"});
  }
  cmd.insert(cmd.end(), {"-x", "OMP_NUM_THREADS=" + std::to_string(threads)});
  cmd.push_back(self_path());
  cmd.insert(cmd.end(), a.args.begin(), a.args.end());

  std::string line;
  for (const std::string& s : cmd) line += (line.empty() ? "" : " ") + quote(s);
  std::fprintf(stderr, "tessera launch: %s\n", line.c_str());
  std::fflush(stderr);
  if (a.dry_run) return kExitOk;
  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  execvp("mpirun", argv.data());
  return fail(Status::NotFound("cannot run mpirun: is OpenMPI installed? (scripts/setup.sh installs openmpi-bin)"));
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto a = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand("launch", "Run tessera on N ranks under mpirun (prints the command it runs)");
  cmd->add_option("-n,--ranks", a->ranks, "number of ranks")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--hosts", a->hosts, "hosts and slots, h1:s,h2:s (default: this machine)");
  cmd->add_option("--threads", a->threads, "OpenMP threads per rank (default: cores / ranks per host)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--dry-run", a->dry_run, "print the mpirun command without running it");
  cmd->add_option("args", a->args, "tessera arguments, after --")->required();
  cmd->callback([a] { exit_code() = run_launch(*a); });
}

}  // namespace tessera::tools
