// tessera elastic --min N --max M --rdzv embedded[:HOST:PORT]|redis://H:P|etcd://H:P --job ID -- train ...:
// the agent of one host in an elastic job (docs/elastic.md). It serves the
// embedded rendezvous store when it is the first (it could bind HOST:PORT;
// Redis and etcd are external: the agent only checks they answer), starts
// the worker (this binary with the arguments after --, the TESSERA_ELASTIC_*
// variables set), watches it and restarts it when it dies (up to
// --max-restarts times). The worker itself joins the rendezvous rounds.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "comm/rendezvous/store.h"
#include "comm/rendezvous/tcp_store.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct ElasticArgs {
  int min = 1, max = 1;
  std::string rdzv = "embedded";
  std::string job = "default";
  int max_restarts = 3;
  double last_call_s = 1.0;
  double rdzv_timeout_s = 60.0;
  std::vector<std::string> args;
};

// How long an agent that cannot bind the embedded store's address tries to
// serve it or reach it (the worker's own connect deadline).
constexpr std::chrono::seconds kEmbeddedConnect{30};

volatile sig_atomic_t g_worker = 0;
volatile sig_atomic_t g_stop = 0;  // the signal that stops this agent
void forward_signal(int sig) {
  g_stop = sig;
  if (g_worker > 0) ::kill(g_worker, sig);
}

pid_t start_worker(const ElasticArgs& a, const std::string& store, int restart) {
  std::vector<std::string> env = {
      fmt::format("TESSERA_ELASTIC_RESTART={}", restart),
      "TESSERA_ELASTIC_STORE=" + store,
      "TESSERA_ELASTIC_JOB=" + a.job,
      fmt::format("TESSERA_ELASTIC_MIN={}", a.min),
      fmt::format("TESSERA_ELASTIC_MAX={}", a.max),
      fmt::format("TESSERA_ELASTIC_LAST_CALL={}", a.last_call_s),
      fmt::format("TESSERA_ELASTIC_RDZV_TIMEOUT={}", a.rdzv_timeout_s),
  };
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t agent = ::getpid();
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  // The worker ends with its agent, even one killed with -9 (as launch's
  // mpirun does): the signal follows the forking thread, the agent's main
  // thread, which lives as long as the agent. An agent gone before prctl:
  // end now.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != agent) ::_exit(1);
  for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
  std::vector<char*> argv;
  std::string self = "/proc/self/exe";
  argv.push_back(self.data());
  std::vector<std::string> args = a.args;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  ::execv(self.c_str(), argv.data());
  std::fprintf(stderr, "tessera: error: elastic: cannot start the worker: %s\n", std::strerror(errno));
  ::_exit(127);
}

int run_elastic(const ElasticArgs& a) {
  if (a.args.empty() || a.args[0] != "train")
    return fail(Status::InvalidArgument("elastic: give the worker's command after --: -- train --config FILE"));
  if (a.min < 1 || a.max < a.min)
    return fail(Status::InvalidArgument(fmt::format("--min {} and --max {}: need 1 <= min <= max", a.min, a.max)));
  if (a.job.empty() || a.job.find_first_of(" \t\n/") != std::string::npos)
    return fail(Status::InvalidArgument(
        fmt::format("--job '{}': the job id must be non-empty, without spaces or '/' (it prefixes the store keys)",
                    a.job)));
  Result<comm::StoreAddress> addr = comm::parse_store_address(a.rdzv);
  if (!addr.ok()) return fail(Status::InvalidArgument("--rdzv " + addr.status().message()));
  const std::string host = addr->host;
  const int port = addr->port;
  std::unique_ptr<comm::StoreServer> server;
  if (addr->kind == comm::StoreAddress::Kind::kEmbedded) {
    // The first agent to bind the address serves the store; the others use
    // it. The address in use is not proof that a store serves it: an
    // unrelated connection may hold the port for a while (an outgoing one
    // whose ephemeral port it is). So an agent that can neither bind nor
    // connect tries both again until the workers' own connect deadline,
    // and one of the agents serves once the port is free.
    const auto deadline = std::chrono::steady_clock::now() + kEmbeddedConnect;
    bool told = false;
    while (true) {
      Result<std::unique_ptr<comm::StoreServer>> started = comm::StoreServer::start(host, port);
      if (started.ok()) {
        server = std::move(started).value();
        std::printf("elastic: agent %d serves the rendezvous store on %s:%d (job '%s')\n", ::getpid(), host.c_str(),
                    port, a.job.c_str());
        break;
      }
      if (started.status().code() != StatusCode::kUnavailable) return fail(started.status());
      Result<std::unique_ptr<comm::Store>> probe = comm::connect_store(*addr, std::chrono::milliseconds(200));
      if (probe.ok()) break;  // another agent serves it
      if (std::chrono::steady_clock::now() >= deadline)
        return fail(Status::Unavailable(fmt::format(
            "elastic: nobody serves the rendezvous store {}:{} and this agent cannot either, for {} s: {}; {}", host,
            port, kEmbeddedConnect.count(), started.status().message(), probe.status().message())));
      if (!told) {
        std::printf("elastic: agent %d: %s:%d is in use but no store answers there yet; trying to serve it or reach "
                    "it for %lld s\n",
                    ::getpid(), host.c_str(), port, static_cast<long long>(kEmbeddedConnect.count()));
        std::fflush(stdout);
        told = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  } else {
    // An external store: reachable and willing now, or one line before any
    // worker starts (each worker then has its own connection).
    Result<std::unique_ptr<comm::Store>> probe =
        comm::connect_store(*addr, std::chrono::seconds(5), std::chrono::seconds(10));
    if (!probe.ok()) return fail(probe.status());
    std::printf("elastic: agent %d uses the rendezvous store %s (job '%s', keys under '%s/')\n", ::getpid(),
                addr->url().c_str(), a.job.c_str(), a.job.c_str());
  }
  const std::string store = addr->url();
  struct sigaction sa{};
  sa.sa_handler = forward_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  int restarts = 0;
  int code = kExitOk;
  while (true) {
    pid_t pid = start_worker(a, store, restarts);
    if (pid < 0) return fail(Status::Internal(fmt::format("elastic: fork: {}", std::strerror(errno))));
    g_worker = pid;
    if (g_stop) ::kill(pid, g_stop);  // the signal came before g_worker was set
    std::printf("elastic: agent %d started worker pid %d (restart %d of %d)\n", ::getpid(), pid, restarts,
                a.max_restarts);
    std::fflush(stdout);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    g_worker = 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
    if (g_stop) {
      // Stopped (SIGTERM, SIGINT): no restart, and no serving the store on.
      std::printf("elastic: agent %d stopped by signal %d\n", ::getpid(), static_cast<int>(g_stop));
      return 128 + g_stop;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == kExitError) {
      // The worker reported why in one line (a bad config, fewer than min
      // workers): the whole job's error; neither a restart nor serving the
      // store longer would help.
      return kExitError;
    }
    const std::string how = WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                                                : fmt::format("exited with status {}", WEXITSTATUS(status));
    if (restarts >= a.max_restarts) {
      std::fprintf(stderr, "tessera: error: elastic: worker pid %d %s; no restarts left (--max-restarts %d)\n", pid,
                   how.c_str(), a.max_restarts);
      code = kExitError;
      break;
    }
    restarts++;
    std::printf("elastic: worker pid %d %s; restarting it to rejoin (%d of %d)\n", pid, how.c_str(), restarts,
                a.max_restarts);
  }
  if (server) {
    // The store outlives this host's worker (even a failed one) until every
    // worker of the last round has finished and every other worker has let
    // go of its connection, or nobody has used the store for the rendezvous
    // timeout + 30 s (the others are gone too). A worker of an earlier round
    // can still be in a collective it has not seen fail (its deadline is
    // parallel.timeout) when the job ends: it comes back to the store, reads
    // JOB/done and ends (cli.elastic_kill's straggler, 60 s in a send).
    if (code != kExitOk)
      std::printf("elastic: agent %d keeps serving the rendezvous store until the job ends\n", ::getpid());
    std::fflush(stdout);
    while (server->idle_seconds() < a.rdzv_timeout_s + 30 && !g_stop) {
      std::string last, closed, finished;
      if (server->get(a.job + "/last", &last) && server->get(fmt::format("{}/r{}/closed", a.job, last), &closed)) {
        if (closed.rfind("fail:", 0) == 0) break;  // the job failed below min: nobody goes on
        if (server->get(a.job + "/finished", &finished) && std::atoi(finished.c_str()) >= std::atoi(closed.c_str()) &&
            server->open_connections() == 0)
          break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return code;
}

}  // namespace

void add_elastic_command(CLI::App& app) {
  auto a = std::make_shared<ElasticArgs>();
  CLI::App* cmd = app.add_subcommand(
      "elastic", "Elastic data-parallel training: an agent per host; workers may leave and join (docs/elastic.md)");
  cmd->add_option("--min", a->min, "fewest workers the job runs with")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--max", a->max, "most workers the job runs with")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--rdzv", a->rdzv,
                  "rendezvous store: embedded (127.0.0.1:29400) or embedded:HOST:PORT (the first agent that can "
                  "bind it serves it), redis://HOST:PORT or etcd://HOST:PORT (an external server)");
  cmd->add_option("--job", a->job, "job id: the rendezvous keys' prefix");
  cmd->add_option("--max-restarts", a->max_restarts, "restarts of this host's worker after it dies")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--last-call", a->last_call_s, "seconds a round waits for more workers once min have joined")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rdzv-timeout", a->rdzv_timeout_s,
                  "seconds a round waits below min before the job fails")
      ->check(CLI::PositiveNumber);
  cmd->add_option("args", a->args, "the worker's tessera arguments, after --: train --config FILE ...")->required();
  cmd->callback([a] { exit_code() = run_elastic(*a); });
}

}  // namespace tessera::tools
