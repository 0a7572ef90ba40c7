#include "comm/rendezvous/etcd_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <openssl/x509.h>

namespace tessera::comm {

namespace {

using json = nlohmann::json;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string b64(const std::string& in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; k--) out.push_back(kB64[(v >> (6 * k)) & 63]);
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

// Standard base64 with '=' padding (what grpc-gateway writes); false at the
// first character that is not (a truncated or corrupted reply).
bool unb64(const std::string& in, std::string* out) {
  out->clear();
  uint32_t v = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; i++) {
    const char* p = in[i] == '\0' ? nullptr : std::strchr(kB64, in[i]);
    if (!p) return false;
    v = (v << 6) | static_cast<uint32_t>(p - kB64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((v >> bits) & 0xff));
    }
  }
  const size_t data = i;
  for (; i < in.size(); i++)
    if (in[i] != '=') return false;
  // Whole 4-character groups, at most 2 of them '=' (or none when unpadded).
  const size_t pad = in.size() - data;
  return pad <= 2 && (pad == 0 ? data % 4 != 1 : in.size() % 4 == 0);
}

// grpc-gateway writes 64-bit integers as strings.
int64_t as_i64(const json& j) {
  if (j.is_string()) return std::strtoll(j.get<std::string>().c_str(), nullptr, 10);
  return j.is_number() ? j.get<int64_t>() : 0;
}

struct Kv {
  bool found = false;
  std::string value;
  int64_t mod_revision = 0;
};

// One POST. etcd's gateway ends every error reply with an HTTP trailer
// (Grpc-Trailer-Content-Type) after the last chunk, which cpp-httplib 0.11
// does not read: it reports a read error although the status line and the
// whole JSON body arrived. So the reply is kept when it did: status and
// body set, true; false with *why for a request that got no reply.
bool etcd_post(httplib::Client& c, const std::string& path, const httplib::Headers& headers, const std::string& body,
               int* status, std::string* reply, std::string* why) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = c.send(req, res, err);
  if (ok || (err == httplib::Error::Read && res.status > 0 && json::accept(res.body))) {
    *status = res.status;
    *reply = std::move(res.body);
    return true;
  }
  *why = httplib::to_string(err);
  return false;
}

// The first key-value of a range reply (etcd's RangeResponse as JSON).
// Corruption naming the reply when it is not JSON or its value not base64.
Result<Kv> first_kv(const std::string& address, const json& range, const std::string& text) {
  Kv kv;
  if (range.is_discarded() || !range.is_object())
    return Status::Corruption(
        fmt::format("rendezvous store {}: a range reply that is not a JSON object: '{}'", address, text.substr(0, 120)));
  if (range.contains("kvs") && range["kvs"].is_array() && !range["kvs"].empty()) {
    const json& e = range["kvs"][0];
    kv.found = true;
    const json v = e.is_object() ? e.value("value", json("")) : json();
    if (!v.is_string() || !unb64(v.get<std::string>(), &kv.value))
      return Status::Corruption(fmt::format("rendezvous store {}: a range reply whose value is not base64: '{}'",
                                            address, text.substr(0, 120)));
    kv.mod_revision = as_i64(e.value("mod_revision", json("0")));
  }
  return kv;
}

}  // namespace

Status etcd_http_status(const std::string& address, const std::string& path, int http_status,
                        const std::string& body) {
  if (http_status == 200) return Status::OK();
  const std::string msg =
      fmt::format("rendezvous store {} {} {}: HTTP {} {}", address, http_status >= 500 ? "failed" : "refused", path,
                  http_status, body.substr(0, 200));
  // grpc-gateway's codes: 503 Unavailable (no leader, leader changed,
  // request timed out), 504 deadline, 500 internal, 429 too many requests;
  // 408 a request timeout. The rest (400, 404, ...) a request that is wrong.
  if (http_status >= 500 || http_status == 429 || http_status == 408) return Status::Unavailable(msg);
  return Status::InvalidArgument(msg);
}

Result<std::unique_ptr<EtcdStore>> EtcdStore::connect(const std::string& host, int port,
                                                      std::chrono::milliseconds connect_timeout,
                                                      std::chrono::milliseconds timeout, StoreCredentials cred) {
  std::unique_ptr<EtcdStore> s(new EtcdStore());
  s->host_ = host;
  s->port_ = port;
  s->cred_ = std::move(cred);
  if (!s->cred_.password.empty() && s->cred_.user.empty()) s->cred_.user = "root";
  if (s->cred_.tls) {
    // https: the server's certificate is checked (against
    // TESSERA_RDZV_TLS_CA, else the system's CAs) and must name the host.
    s->http_ = std::make_unique<httplib::Client>(fmt::format("https://{}:{}", host, port), s->cred_.tls_cert,
                                                 s->cred_.tls_key);
    if (!s->cred_.tls_ca.empty()) s->http_->set_ca_cert_path(s->cred_.tls_ca.c_str());
    s->http_->enable_server_certificate_verification(true);
  } else {
    s->http_ = std::make_unique<httplib::Client>(host, port);
  }
  const time_t sec = timeout.count() / 1000, usec = (timeout.count() % 1000) * 1000;
  s->http_->set_connection_timeout(sec, usec);
  s->http_->set_read_timeout(sec, usec);
  s->http_->set_write_timeout(sec, usec);
  s->http_->set_keep_alive(true);
  // The first request: the server's status (is it etcd, does it answer?).
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  while (true) {
    int status = 0;
    std::string reply, why;
    if (etcd_post(*s->http_, "/v3/maintenance/status", {}, "{}", &status, &reply, &why)) {
      const Status st = etcd_http_status(s->address(), "/v3/maintenance/status", status, reply);
      if (st.ok() && json::accept(reply)) {
        if (s->cred_.password.empty()) return s;
        const Status auth = s->authenticate();
        if (auth.ok()) return s;
        if (auth.code() != StatusCode::kUnavailable) return auth;
        why = auth.message();
        if (std::chrono::steady_clock::now() >= deadline)
          return Status::Unavailable(fmt::format("rendezvous store {} not ready within {:.0f} s: {}", s->address(),
                                                 connect_timeout.count() / 1e3, why));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      // A server that will answer later (5xx: no leader yet, starting) is
      // asked again; one that refuses, or is not etcd, is reported now.
      if (st.ok() || st.code() != StatusCode::kUnavailable)
        return Status::InvalidArgument(fmt::format("rendezvous store {} refused /v3/maintenance/status: HTTP {} {}",
                                                   s->address(), status, reply.substr(0, 120)));
      why = fmt::format("HTTP {} {}", status, reply.substr(0, 120));
    } else if (s->cred_.tls && why.find("SSL") != std::string::npos) {
      // The server is there but the handshake failed: retrying will not
      // change its certificate (or ours).
      const long verify = s->http_->get_openssl_verify_result();
      return Status::InvalidArgument(fmt::format(
          "rendezvous store {}: TLS: {}{} (its certificate is checked against {}{})", s->address(), why,
          verify != X509_V_OK ? fmt::format(": {}", X509_verify_cert_error_string(verify)) : std::string(),
          s->cred_.tls_ca.empty() ? "the system's CAs; set TESSERA_RDZV_TLS_CA" : "TESSERA_RDZV_TLS_CA=" + s->cred_.tls_ca,
          s->cred_.tls_cert.empty() ? "" : "; our certificate is TESSERA_RDZV_TLS_CERT=" + s->cred_.tls_cert));
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Unavailable(fmt::format("rendezvous store {} unreachable for {:.0f} s: {}", s->address(),
                                             connect_timeout.count() / 1e3, why));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

EtcdStore::~EtcdStore() = default;

std::string EtcdStore::address() const {
  return fmt::format("{}://{}:{}", cred_.tls ? "etcds" : "etcd", host_, port_);
}

// The interface that routes to the server: a UDP socket connect()ed there
// (nothing is sent) and its local address.
std::string EtcdStore::local_address() const {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* ai = nullptr;
  std::string out = "127.0.0.1";
  if (::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &ai) != 0 || !ai) return out;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (fd >= 0 && ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
    out = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(ai);
  return out;
}

Status EtcdStore::authenticate() {
  const std::string path = "/v3/auth/authenticate";
  int status = 0;
  std::string body, failed;
  if (!etcd_post(*http_, path, {}, json{{"name", cred_.user}, {"password", cred_.password}}.dump(), &status, &body,
                 &failed))
    return Status::Unavailable(fmt::format("rendezvous store {}: {} failed: {}", address(), path, failed));
  if (status != 200) {
    const Status st = etcd_http_status(address(), path, status, body);
    if (st.code() == StatusCode::kUnavailable) return st;
    const json j = json::parse(body, nullptr, false);
    const std::string why = j.is_object() && j.contains("error") && j["error"].is_string()
                                ? j["error"].get<std::string>()
                                : body.substr(0, 120);
    return Status::InvalidArgument(fmt::format(
        "rendezvous store {} refused the credentials of TESSERA_RDZV_USER ('{}') and TESSERA_RDZV_PASSWORD(_FILE): {}",
        address(), cred_.user, why));
  }
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("token") || !j["token"].is_string())
    return Status::InvalidArgument(
        fmt::format("rendezvous store {}: {} answered without a token: '{}' (is authentication enabled?)", address(),
                    path, body.substr(0, 120)));
  token_ = j["token"].get<std::string>();
  return Status::OK();
}

Result<std::string> EtcdStore::post(const std::string& path, const std::string& body) {
  for (int attempt = 0;; attempt++) {
    httplib::Headers headers;
    if (!token_.empty()) headers.emplace("Authorization", token_);
    int status = 0;
    std::string reply, failed;
    if (!etcd_post(*http_, path, headers, body, &status, &reply, &failed))
      return Status::Unavailable(fmt::format("rendezvous store {}: {} failed: {}", address(), path, failed));
    // A simple token expires (etcd's --auth-token-ttl, 300 s by default):
    // take a new one, once per request.
    if (attempt == 0 && !cred_.password.empty() && status != 200 &&
        reply.find("invalid auth token") != std::string::npos) {
      RETURN_IF_ERROR(authenticate());
      continue;
    }
    if (status != 200 && cred_.password.empty() && reply.find("user name is empty") != std::string::npos)
      return Status::InvalidArgument(fmt::format(
          "rendezvous store {} requires a user: give it in TESSERA_RDZV_USER and the password in "
          "TESSERA_RDZV_PASSWORD_FILE or TESSERA_RDZV_PASSWORD ({} answered HTTP {})",
          address(), path, status));
    RETURN_IF_ERROR(etcd_http_status(address(), path, status, reply));
    return reply;
  }
}

Status EtcdStore::set(const std::string& key, const std::string& value) {
  return post("/v3/kv/put", json{{"key", b64(key)}, {"value", b64(value)}}.dump()).status();
}

Result<std::string> EtcdStore::get(const std::string& key) {
  ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", json{{"key", b64(key)}}.dump()));
  ASSIGN_OR_RETURN(Kv kv, first_kv(address(), json::parse(body, nullptr, false), body));
  if (!kv.found) return Status::NotFound(fmt::format("store: no key '{}'", key));
  return kv.value;
}

Result<int64_t> EtcdStore::add(const std::string& key, int64_t delta) {
  const std::string k = b64(key);
  ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", json{{"key", k}}.dump()));
  ASSIGN_OR_RETURN(Kv cur, first_kv(address(), json::parse(body, nullptr, false), body));
  // A read (the rendezvous polls counters with add(0)): no write, which
  // etcd would commit through its log (an fsync) every time.
  if (delta == 0 && !cur.found) return 0;
  for (int attempt = 0; attempt < 10000; attempt++) {
    char* end = nullptr;
    const int64_t was = cur.found ? std::strtoll(cur.value.c_str(), &end, 10) : 0;
    if (cur.found && (cur.value.empty() || *end != '\0'))
      return Status::InvalidArgument(fmt::format("rendezvous store {}: add to '{}': its value '{}' is not a counter",
                                                 address(), key, cur.value.substr(0, 32)));
    const int64_t now = was + delta;
    if (delta == 0) return now;
    // Put only if nobody changed the key since it was read (or, absent,
    // nobody created it); else the failure branch reads it back.
    json compare = {{"key", k}, {"result", "EQUAL"}};
    if (cur.found) {
      compare["target"] = "MOD";
      compare["mod_revision"] = std::to_string(cur.mod_revision);
    } else {
      compare["target"] = "CREATE";
      compare["create_revision"] = "0";
    }
    const json txn = {{"compare", json::array({compare})},
                      {"success", json::array({{{"request_put", {{"key", k}, {"value", b64(std::to_string(now))}}}}})},
                      {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
    ASSIGN_OR_RETURN(std::string reply, post("/v3/kv/txn", txn.dump()));
    const json j = json::parse(reply, nullptr, false);
    if (!j.is_object())
      return Status::Corruption(fmt::format("rendezvous store {}: a txn reply that is not a JSON object: '{}'",
                                            address(), reply.substr(0, 120)));
    if (j.value("succeeded", false)) return now;
    cur = Kv{};
    if (j.contains("responses") && j["responses"].is_array() && !j["responses"].empty() &&
        j["responses"][0].is_object() && j["responses"][0].contains("response_range")) {
      ASSIGN_OR_RETURN(cur, first_kv(address(), j["responses"][0]["response_range"], reply));
    }
  }
  return Status::Unavailable(fmt::format("rendezvous store {}: add to '{}' lost every race", address(), key));
}

}  // namespace tessera::comm
