// tessera launch -n N [--hosts h1:s,h2:s] [--netns] -- <tessera args>: runs
// this tessera binary under mpirun with the flags this machine needs, and
// prints the mpirun command first. Hosts are reached with ssh (mpirun's
// default) or, with --netns, inside the network namespaces of the emulated
// cluster (scripts/cluster.sh): mpirun itself runs in the first host's
// namespace and reaches the others through scripts/netns-agent.sh. Under
// Slurm, run `srun tessera train ...` directly (docs/parallel.md).
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct LaunchArgs {
  int ranks = 1;
  std::string hosts;  // "h1:slots,h2:slots"
  int threads = 0;    // OpenMP threads per rank; 0: cores / ranks per host
  bool dry_run = false;
  bool netns = false;     // hosts are network namespaces (scripts/cluster.sh)
  std::string agent;      // rsh agent; default with --netns: scripts/netns-agent.sh
  std::string tcp_if;     // interfaces or subnet for MPI's TCP traffic
  int dead_host_s = 30;   // with --hosts: the daemons give up on a silent host after about this long
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

// scripts/netns-agent.sh, found beside this binary's source tree
// (build/release/tessera -> ../../scripts) or under the working directory.
std::string default_agent() {
  namespace fs = std::filesystem;
  fs::path exe = self_path();
  for (fs::path p : {exe.parent_path() / "../../scripts/netns-agent.sh", fs::path("scripts/netns-agent.sh")}) {
    std::error_code ec;
    if (fs::exists(p, ec)) return fs::canonical(p, ec).string();
  }
  return "";
}

int supervise(std::vector<std::string>& cmd);

int run_launch(const LaunchArgs& a) {
  if (a.args.empty()) return fail(Status::InvalidArgument("nothing to launch: give the tessera arguments after --"));
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  int hosts = 1;
  if (!a.hosts.empty()) hosts = 1 + static_cast<int>(std::count(a.hosts.begin(), a.hosts.end(), ','));
  // Namespace "hosts" share this machine's cores.
  const int ranks_per_host = a.netns ? a.ranks : (a.ranks + hosts - 1) / hosts;
  const int threads = a.threads > 0 ? a.threads : std::max(1, cores / ranks_per_host);
  const bool oversubscribed = ranks_per_host * threads > cores;

  std::vector<std::string> cmd;
  if (a.netns) {
    if (a.hosts.empty()) return fail(Status::InvalidArgument("--netns needs --hosts (the cluster's host names)"));
    std::string agent = a.agent.empty() ? default_agent() : a.agent;
    if (agent.empty()) return fail(Status::NotFound("scripts/netns-agent.sh not found; pass --agent PATH"));
    const std::string first = a.hosts.substr(0, a.hosts.find_first_of(":,"));
    cmd.insert(cmd.end(), {"ip", "netns", "exec", first, "env", "TESSERA_HOST=" + first, "mpirun"});
    cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", agent});
  } else {
    cmd.push_back("mpirun");
  }
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  cmd.insert(cmd.end(), {"-np", std::to_string(a.ranks)});
  if (!a.hosts.empty()) cmd.insert(cmd.end(), {"--host", a.hosts});
  if (!a.tcp_if.empty()) {
    // Pin both MPI's data path and its out-of-band channel to these links.
    cmd.insert(cmd.end(), {"--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", a.tcp_if, "--mca",
                           "oob_tcp_if_include", a.tcp_if});
  }
  if (!a.hosts.empty() && a.dead_host_s > 0 && std::getenv("OMPI_MCA_oob_tcp_keepalive_time") == nullptr) {
    // OpenMPI's daemons notice a host that went silent (cut, powered off)
    // through TCP keepalive on their idle control connections: by default
    // 300 s idle, then 9 probes 20 s apart, while mpirun waits and the
    // daemon on the lost host lives on. Probing once a second bounds both
    // (issue #18 item 6). A connection with data in
    // flight is bounded by the kernel's net.ipv4.tcp_retries2 instead
    // (docs/cluster.md).
    // The idle time runs from the connection's last packet, which may be
    // before the host was lost: the probes alone (most of the time) are
    // the least a host gets, so ranks with a shorter parallel.timeout report
    // the lost peer first.
    const int idle = std::max(1, a.dead_host_s / 5);
    const int probes = std::max(1, a.dead_host_s - idle);
    cmd.insert(cmd.end(), {"--mca", "oob_tcp_keepalive_time", std::to_string(idle), "--mca",
                           "oob_tcp_keepalive_intvl", "1", "--mca", "oob_tcp_keepalive_probes",
                           std::to_string(probes)});
  }
  if (a.netns) {
    // Every namespace "host" runs its own daemon, which binds its ranks from
    // core 0 without knowing of the others on this machine: --bind-to core
    // put every rank on CPU 0. The kernel spreads unbound ranks instead.
    if (oversubscribed) cmd.push_back("--oversubscribe");
    cmd.insert(cmd.end(), {"--bind-to", "none"});
  } else if (oversubscribed) {
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
  return supervise(cmd);
}

// Whether mpirun's output says the job is over: a rank aborted it (a
// deadline error), or mpirun lost a host's daemon (TCP keepalive; issue #18
// item 6). OpenMPI files a daemon lost mid-job under either message.
bool job_failed(const std::string& text) {
  for (const char* m : {"MPI_ABORT was invoked", "lost communication with a remote daemon",
                        "unable to reliably start one or more daemons"})
    if (text.find(m) != std::string::npos) return true;
  return false;
}

// Runs mpirun as a child, passing its stderr through line by line. When a
// rank aborts the job (a deadline error), mpirun kills the other ranks; but
// if a host has become unreachable (a cut link, a dead node) mpirun waits
// for that host's daemon forever. So once mpirun reports that the job
// failed, it gets kAbortGrace to end by itself before the launcher ends it.
int supervise(std::vector<std::string>& cmd) {
  constexpr auto kAbortGrace = std::chrono::seconds(10);
  int err_pipe[2];
  if (pipe(err_pipe) != 0) return fail(Status::IOError(fmt::format("pipe: {}", std::strerror(errno))));
  const pid_t launcher = getpid();
  pid_t child = fork();
  if (child < 0) return fail(Status::IOError(fmt::format("fork: {}", std::strerror(errno))));
  if (child == 0) {
    // When the launcher dies, even by kill -9, mpirun gets SIGTERM and ends
    // its ranks (issue #18: they trained on as orphans). The signal follows
    // the thread that forked, which is this process's main thread: it lives
    // as long as the launcher. It survives exec (ip, env and mpirun are not
    // set-user-ID). A launcher that died before prctl: end now.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) _exit(1);
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    close(err_pipe[1]);
    std::vector<char*> argv;
    for (std::string& s : cmd) argv.push_back(s.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "tessera: error: cannot run %s: %s (scripts/setup.sh installs openmpi-bin)\n", argv[0],
                 std::strerror(errno));
    _exit(127);
  }
  close(err_pipe[1]);
  // Ctrl-C and kill reach mpirun, which ends the ranks.
  static pid_t g_child = 0;
  g_child = child;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { kill(g_child, sig); };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::optional<std::chrono::steady_clock::time_point> aborted;
  std::string line;
  char buf[4096];
  bool open = true;
  int wstatus = 0;
  for (;;) {
    if (open) {
      pollfd pfd{err_pipe[0], POLLIN, 0};
      if (poll(&pfd, 1, 200) > 0) {
        ssize_t n = read(err_pipe[0], buf, sizeof(buf));
        if (n <= 0) {
          open = false;
        } else {
          fwrite(buf, 1, n, stderr);
          fflush(stderr);
          line.append(buf, n);
          if (!aborted && job_failed(line)) aborted = std::chrono::steady_clock::now();
          if (line.size() > 4096) line.erase(0, line.size() - 256);
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    pid_t r = waitpid(child, &wstatus, WNOHANG);
    if (r == child) break;
    if (aborted && std::chrono::steady_clock::now() - *aborted > kAbortGrace) {
      std::fprintf(stderr,
                   "tessera launch: mpirun did not end %lld s after the job failed (a host is probably "
                   "unreachable); ending it\n",
                   static_cast<long long>(kAbortGrace.count()));
      kill(child, SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      kill(child, SIGKILL);
      waitpid(child, &wstatus, 0);
      return kExitError;
    }
  }
  // Drain what is left of stderr, for a bounded time: a daemon that outlived
  // mpirun (on a host it could not reach) may hold the pipe open.
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (open && std::chrono::steady_clock::now() < drain_until) {
    pollfd pfd{err_pipe[0], POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = read(err_pipe[0], buf, sizeof(buf));
    if (n <= 0) break;
    fwrite(buf, 1, n, stderr);
  }
  close(err_pipe[0]);
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  return kExitError;
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
  cmd->add_flag("--netns", a->netns, "the hosts are network namespaces of scripts/cluster.sh");
  cmd->add_option("--agent", a->agent, "mpirun rsh agent (default with --netns: scripts/netns-agent.sh)");
  cmd->add_option("--tcp-if", a->tcp_if, "interfaces or subnet (CIDR) MPI's TCP traffic must use");
  cmd->add_option("--dead-host-timeout", a->dead_host_s,
                  "with --hosts: about how many seconds the job's daemons wait on a host that stopped answering "
                  "before the job ends (0: OpenMPI's default, minutes)")
      ->capture_default_str()
      ->check(CLI::Range(0, 86400));
  cmd->add_option("args", a->args, "tessera arguments, after --")->required();
  cmd->callback([a] { exit_code() = run_launch(*a); });
}

}  // namespace tessera::tools
