#include "comm/rendezvous/store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "comm/rendezvous/etcd_store.h"
#include "comm/rendezvous/redis_store.h"
#include "comm/rendezvous/tcp_store.h"

namespace tessera::comm {

Status Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  size_t i = 0;
  while (i < keys.size()) {
    Result<std::string> v = get(keys[i]);
    if (v.ok()) {
      i++;
      continue;
    }
    if (v.status().code() != StatusCode::kNotFound) return v.status();
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      for (size_t j = i; j < keys.size() && j < i + 4; j++) missing += (missing.empty() ? "" : ", ") + keys[j];
      return Status::Unavailable(fmt::format("rendezvous store {}: keys not set within {:.1f} s: {}", address(),
                                             timeout.count() / 1e3, missing));
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(20));
  }
  return Status::OK();
}

std::string StoreAddress::url() const {
  switch (kind) {
    case Kind::kRedis: return fmt::format("{}://{}:{}", tls ? "rediss" : "redis", host, port);
    case Kind::kEtcd: return fmt::format("{}://{}:{}", tls ? "etcds" : "etcd", host, port);
    default: return fmt::format("embedded:{}:{}", host, port);
  }
}

Result<StoreAddress> parse_store_address(const std::string& text) {
  StoreAddress a;
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format(
        "'{}': {}; the store is embedded, embedded:HOST:PORT, redis[s]://HOST:PORT or etcd[s]://HOST:PORT", text,
        why));
  };
  std::string rest;
  if (text == "embedded") return a;
  if (text.rfind("embedded:", 0) == 0) {
    rest = text.substr(9);
  } else if (text.rfind("redis://", 0) == 0 || text.rfind("etcd://", 0) == 0 || text.rfind("rediss://", 0) == 0 ||
             text.rfind("etcds://", 0) == 0) {
    const bool redis = text[0] == 'r';
    const size_t scheme = text.find("://");
    a.kind = redis ? StoreAddress::Kind::kRedis : StoreAddress::Kind::kEtcd;
    a.tls = text.compare(0, scheme, redis ? "rediss" : "etcds") == 0;
    a.port = redis ? 6379 : 2379;
    rest = text.substr(scheme + 3);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    if (rest.find(':') == std::string::npos) {  // redis://HOST
      if (rest.empty()) return bad("no host");
      a.host = rest;
      return a;
    }
  } else if (text.find("://") != std::string::npos) {
    return bad("unknown scheme '" + text.substr(0, text.find("://")) + "'");
  } else {
    rest = text;  // HOST:PORT: the embedded store
  }
  Status s = parse_host_port(rest, &a.host, &a.port);
  if (!s.ok()) return bad(s.message());
  return a;
}

Result<StoreCredentials> store_credentials_from_env() {
  StoreCredentials c;
  if (const char* u = std::getenv("TESSERA_RDZV_USER")) c.user = u;
  if (const char* f = std::getenv("TESSERA_RDZV_PASSWORD_FILE"); f && *f) {
    const auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(fmt::format("TESSERA_RDZV_PASSWORD_FILE={}: {}", f, why));
    };
    struct stat st;
    if (::stat(f, &st) != 0) return bad(std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return bad("not a regular file");
    if (st.st_size > 4096) return bad("over 4 KiB; the first line must be the password");
    std::ifstream in(f, std::ios::binary);
    if (!in) return bad("cannot read");
    std::getline(in, c.password);
    if (!c.password.empty() && c.password.back() == '\r') c.password.pop_back();
    if (c.password.empty()) return bad("the first line (the password) is empty");
    return c;
  }
  if (const char* p = std::getenv("TESSERA_RDZV_PASSWORD")) c.password = p;
  return c;
}

namespace {

// The TLS files of the environment (StoreCredentials).
Status tls_files_from_env(StoreCredentials* c) {
  for (auto [var, dst] : {std::pair<const char*, std::string*>{"TESSERA_RDZV_TLS_CA", &c->tls_ca},
                          {"TESSERA_RDZV_TLS_CERT", &c->tls_cert},
                          {"TESSERA_RDZV_TLS_KEY", &c->tls_key}}) {
    const char* f = std::getenv(var);
    if (!f || !*f) continue;
    struct stat st;
    if (::stat(f, &st) != 0) return Status::InvalidArgument(fmt::format("{}={}: {}", var, f, std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(fmt::format("{}={}: not a regular file", var, f));
    if (::access(f, R_OK) != 0) return Status::InvalidArgument(fmt::format("{}={}: cannot read", var, f));
    *dst = f;
  }
  if (c->tls_cert.empty() != c->tls_key.empty())
    return Status::InvalidArgument("TESSERA_RDZV_TLS_CERT and TESSERA_RDZV_TLS_KEY go together (a client certificate "
                                   "and its private key)");
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Store>> connect_store(const StoreAddress& a, std::chrono::milliseconds connect_timeout,
                                             std::chrono::milliseconds timeout) {
  if (a.kind == StoreAddress::Kind::kEmbedded) {
    ASSIGN_OR_RETURN(std::unique_ptr<StoreClient> c, StoreClient::connect(a.host, a.port, connect_timeout, timeout));
    return std::unique_ptr<Store>(std::move(c));
  }
  ASSIGN_OR_RETURN(StoreCredentials cred, store_credentials_from_env());
  cred.tls = a.tls;
  if (a.tls) RETURN_IF_ERROR(tls_files_from_env(&cred));
  if (a.kind == StoreAddress::Kind::kRedis) {
    ASSIGN_OR_RETURN(std::unique_ptr<RedisStore> r,
                     RedisStore::connect(a.host, a.port, connect_timeout, timeout, std::move(cred)));
    return std::unique_ptr<Store>(std::move(r));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdStore> e,
                   EtcdStore::connect(a.host, a.port, connect_timeout, timeout, std::move(cred)));
  return std::unique_ptr<Store>(std::move(e));
}

}  // namespace tessera::comm
