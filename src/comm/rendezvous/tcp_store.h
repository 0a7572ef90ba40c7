// A small key-value store over TCP for rendezvous (how elastic workers find
// each other): set, get, add and wait, as Gloo's rendezvous::Store and
// TorchElastic's c10d store offer. One process (the first `tessera elastic`
// agent) runs a StoreServer; every worker talks to it with a StoreClient.
//
// Wire format (docs/formats/store.md): each request is a frame
//   u32 length (little-endian, bytes after it, <= kMaxFrame)
//   u8 op (1 set, 2 get, 3 add), u32 key length, key, value (the rest)
// and each reply a frame of u8 status (0 ok, 1 not found, 2 bad request)
// followed by the value (get: the stored bytes; add: the new counter as
// decimal text). Keys are at most kMaxKey bytes, values kMaxValue. A bad
// frame gets status 2 with a message and the connection is closed.
//
// Threading: the server runs an accept thread and one thread per client;
// its map is guarded by one mutex. A StoreClient is used by one thread at a
// time (it holds one connection and reconnects once after a broken one;
// an add whose request went out is never resent: Unavailable instead).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous/store.h"
#include "core/status.h"

namespace tessera::comm {

constexpr uint32_t kStoreMaxKey = 4096;
constexpr uint32_t kStoreMaxValue = 1 << 20;
constexpr uint32_t kStoreMaxFrame = 1 + 4 + kStoreMaxKey + kStoreMaxValue;

// "HOST:PORT" -> host, port; error naming the text.
Status parse_host_port(const std::string& s, std::string* host, int* port);

class StoreServer {
 public:
  // Listens on host:port (port 0: any free one, see port()). Errors: the
  // address cannot be resolved or bound (EADDRINUSE is kUnavailable, so a
  // caller can tell "someone else serves it" apart).
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, int port);
  ~StoreServer();  // closes every connection and joins the threads
  int port() const { return port_; }
  // A value set locally (no connection), and a read of a counter.
  void set(const std::string& key, const std::string& value);
  bool get(const std::string& key, std::string* value);
  // Seconds since the last request of any client.
  double idle_seconds() const;
  // Client connections not yet closed by their client (a client holds one
  // for its life: a live worker, even one stuck in a collective).
  int open_connections();

 private:
  StoreServer() = default;
  void accept_loop();
  void serve(int fd);
  std::string handle(const std::string& frame, uint8_t* status);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> last_request_ns_{0};  // steady clock
  std::thread accept_thread_;
  std::mutex mu_;  // guards map_, clients_
  std::map<std::string, std::string> map_;
  // One per connection; a finished one is joined and closed when the next
  // connection is accepted (a list: entries never move under their thread).
  struct Client {
    int fd = -1;
    std::atomic<bool> done{false};
    std::thread thread;
  };
  std::list<Client> clients_;
};

// The embedded store's client (comm/rendezvous/store.h has the contract).
class StoreClient : public Store {
 public:
  // Connects to host:port, retrying until `connect_timeout` (the server may
  // be starting). timeout: the deadline of each operation's I/O.
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& host, int port,
                                                      std::chrono::milliseconds connect_timeout,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~StoreClient() override;

  Status set(const std::string& key, const std::string& value) override;
  Result<std::string> get(const std::string& key) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;
  std::string address() const override;
  std::string local_address() const override;

 private:
  StoreClient() = default;
  // A fresh connection, its connect bounded by `deadline`.
  Status reconnect(std::chrono::steady_clock::time_point deadline);
  Result<std::string> call(uint8_t op, const std::string& key, const std::string& value, uint8_t* status);

  std::string host_;
  int port_ = 0;
  int fd_ = -1;
  std::chrono::milliseconds timeout_{30000};
};

}  // namespace tessera::comm
