// The rendezvous store on an external Redis server (hiredis): set is SET,
// get is GET, add is INCRBY (atomic on the server), wait polls GET. Values
// are binary-safe. Keys are used as given: the rendezvous puts every key of
// a job under "JOB/", so several jobs share one server.
//
// Deadlines: connect_timeout bounds the connection attempts and the first
// PING (retried 100 ms apart while they fail Unavailable: a server starting
// or still loading its dataset), `timeout` every command's send and reply
// (the socket's timeouts). A broken connection is reopened once per command,
// except for INCRBY (it may have been applied). Errors name the server
// ("redis://HOST:PORT") and Redis' own message.
//
// Error classes (redis_error_status): a connection error, a timeout and the
// error replies of a server that will answer later (LOADING, BUSY,
// READONLY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, NOREPLICAS) are Unavailable,
// which the elastic rendezvous retries; every other error reply (NOAUTH,
// WRONGTYPE, ERR, ...) and a reply that is not Redis' protocol are
// InvalidArgument: retrying would not help.
//
// TLS (rediss://, cred.tls): Debian's hiredis 0.14 has none, so each
// connection goes through a TlsTunnel (tls_tunnel.h); a certificate refused
// either way is InvalidArgument naming the store, at connect.
//
// Threading: one thread at a time, as Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/rendezvous/store.h"
#include "comm/rendezvous/tls_tunnel.h"

struct redisContext;

namespace tessera::comm {

// The Status of Redis error reply `reply` (its text after '-', e.g.
// "LOADING Redis is loading the dataset in memory") to command `command` of
// the server at `address`: Unavailable for the transient errors above,
// InvalidArgument for the rest; the message names both.
Status redis_error_status(const std::string& address, const std::string& command, const std::string& reply);

class RedisStore : public Store {
 public:
  // cred.password set: every connection starts with AUTH [user] password;
  // refused credentials are InvalidArgument naming the store.
  static Result<std::unique_ptr<RedisStore>> connect(const std::string& host, int port,
                                                     std::chrono::milliseconds connect_timeout,
                                                     std::chrono::milliseconds timeout, StoreCredentials cred = {});
  ~RedisStore() override;

  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  std::string address() const override;
  std::string local_address() const override;

 private:
  RedisStore() = default;
  Status reconnect(std::chrono::milliseconds connect_timeout);
  // Runs one command (argv form, binary-safe) into *out: the reply's kind
  // and text. A Redis error reply is the returned error.
  struct Reply {
    int type = 0;  // REDIS_REPLY_*
    long long integer = 0;
    std::string str;
  };
  Status command(const std::vector<std::string>& argv, Reply* out);

  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_{30000};
  StoreCredentials cred_;
  std::unique_ptr<TlsTunnel> tunnel_;  // rediss://: hiredis 0.14 talks through it
  redisContext* ctx_ = nullptr;
};

}  // namespace tessera::comm
