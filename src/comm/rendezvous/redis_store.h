// The rendezvous store on an external Redis server (hiredis): set is SET,
// get is GET, add is INCRBY (atomic on the server), wait polls GET. Values
// are binary-safe. Keys are used as given: the rendezvous puts every key of
// a job under "JOB/", so several jobs share one server.
//
// Deadlines: connect_timeout bounds the connection attempts (retried 100 ms
// apart), `timeout` every command's send and reply (the socket's timeouts).
// A broken connection is reopened once per command. Errors name the server
// ("redis://HOST:PORT") and Redis' own message (NOAUTH, protected mode, a
// reply that is not Redis' protocol).
//
// Threading: one thread at a time, as Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/rendezvous/store.h"

struct redisContext;

namespace tessera::comm {

class RedisStore : public Store {
 public:
  static Result<std::unique_ptr<RedisStore>> connect(const std::string& host, int port,
                                                     std::chrono::milliseconds connect_timeout,
                                                     std::chrono::milliseconds timeout);
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
  redisContext* ctx_ = nullptr;
};

}  // namespace tessera::comm
