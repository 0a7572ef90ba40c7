// The rendezvous store on an external etcd server (v3), through its JSON
// gateway over HTTP (cpp-httplib; keys and values travel base64-encoded):
// set is POST /v3/kv/put, get is /v3/kv/range, add is a compare-and-swap
// transaction (/v3/kv/txn: put value + delta if the key's mod_revision is
// still the one read, or create it if it is still absent; retried with the
// value the failed transaction returns; add(key, 0) only reads), wait
// polls get.
//
// Deadlines: connect_timeout bounds the first request's attempts (retried
// 100 ms apart while the server is unreachable or answers 5xx: it may be
// starting or electing a leader), `timeout` every request's connect, send
// and reply. Errors name the server ("etcd://HOST:PORT") and etcd's own
// message. Error classes (etcd_http_status): no connection, a timeout and
// HTTP 5xx, 429, 408 are Unavailable (the elastic rendezvous retries them;
// an add whose transaction failed so may or may not have been applied);
// other HTTP errors InvalidArgument; a reply that is not JSON, or a value
// that is not base64, Corruption naming the reply.
//
// Threading: one thread at a time, as Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/rendezvous/store.h"

namespace httplib {
class Client;
}

namespace tessera::comm {

// OK for HTTP 200; else the Status of a reply to `path` with that HTTP
// status (Unavailable for 5xx, 429, 408; InvalidArgument for the rest),
// naming the server, the path and the body's start.
Status etcd_http_status(const std::string& address, const std::string& path, int http_status,
                        const std::string& body);

class EtcdStore : public Store {
 public:
  // cred.password set: etcd's user authentication (/v3/auth/authenticate,
  // user cred.user, "root" when empty); its token goes with every request
  // and is taken again when etcd says it expired. Refused credentials are
  // InvalidArgument naming the store.
  static Result<std::unique_ptr<EtcdStore>> connect(const std::string& host, int port,
                                                    std::chrono::milliseconds connect_timeout,
                                                    std::chrono::milliseconds timeout, StoreCredentials cred = {});
  ~EtcdStore() override;

  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  std::string address() const override;
  std::string local_address() const override;

 private:
  EtcdStore() = default;
  // POSTs a JSON body to path; the reply's JSON text.
  Result<std::string> post(const std::string& path, const std::string& body);
  // A fresh token for cred_ (Unavailable when etcd cannot answer now).
  Status authenticate();

  std::string host_;
  int port_ = 0;
  StoreCredentials cred_;
  std::string token_;
  std::unique_ptr<httplib::Client> http_;
};

}  // namespace tessera::comm
