// The rendezvous store: a small key-value interface (set, get, add, wait, as
// Gloo's rendezvous::Store and TorchElastic's c10d store offer) that elastic
// training and the Gloo communicator use to find each other. Three
// implementations: the embedded TCP store (tcp_store.h, served by the first
// `tessera elastic` agent), and Redis (redis_store.h) and etcd
// (etcd_store.h), external servers for real clusters. docs/elastic.md has the keys the rendezvous writes.
//
// Every operation has a deadline (the `timeout` given at connect); a server
// that is unreachable, does not answer in time or refuses a request is an
// error naming its address. Unavailable means "may work later" (also a
// server that answers it cannot serve now: Redis LOADING, etcd 503), and
// callers retry it; InvalidArgument (a refusal) or Corruption (a reply
// that makes no sense) will not go away by retrying. docs/elastic.md has
// the table per store.
//
// Threading: a Store is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // NotFound when the key is not set.
  virtual Result<std::string> get(const std::string& key) = 0;
  // Adds delta to the key's counter (0 when unset) and returns the new
  // value; atomic with respect to every other client. Never sent twice: an
  // add that fails Unavailable may or may not have been applied.
  virtual Result<int64_t> add(const std::string& key, int64_t delta) = 0;
  // Blocks until every key is set, polling get() 1 .. 20 ms apart;
  // Unavailable naming the missing keys after `timeout`.
  virtual Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // The server, as the user named it ("127.0.0.1:29400", "redis://h:6379").
  virtual std::string address() const = 0;
  // This end's IP address on the store connection: the interface that
  // reaches the store (what peers on other hosts can reach too).
  virtual std::string local_address() const = 0;
};

// Where the store is: `--rdzv` of `tessera elastic`.
struct StoreAddress {
  enum class Kind { kEmbedded, kRedis, kEtcd };
  Kind kind = Kind::kEmbedded;
  std::string host = "127.0.0.1";
  int port = 29400;
  bool tls = false;  // rediss:// or etcds://
  // "embedded:HOST:PORT", "redis[s]://HOST:PORT" or "etcd[s]://HOST:PORT":
  // parse_store_address's input.
  std::string url() const;
};

// "embedded" (127.0.0.1:29400), "embedded:HOST:PORT", "redis://HOST:PORT"
// (port 6379 when left out), "etcd://HOST:PORT" (2379) or a bare
// "HOST:PORT" (embedded); "rediss://" and "etcds://" are the same over TLS.
// Error naming the text and the accepted forms.
Result<StoreAddress> parse_store_address(const std::string& text);

// Credentials for a Redis or etcd store, from the environment only (never
// the command line, which any user of the host can read with ps):
//   TESSERA_RDZV_USER           the Redis ACL user or etcd user (Redis: its
//                               "default" user when unset)
//   TESSERA_RDZV_PASSWORD_FILE  a file whose first line is the password
//   TESSERA_RDZV_PASSWORD       the password itself (the file wins)
// No password: no authentication. The embedded store takes none.
// For rediss:// and etcds:// (TLS), also from the environment:
//   TESSERA_RDZV_TLS_CA         the CAs the server's certificate is checked
//                               against (PEM; the system's CAs when unset)
//   TESSERA_RDZV_TLS_CERT, TESSERA_RDZV_TLS_KEY
//                               a client certificate and its key (PEM), for
//                               servers that ask for one
// The server's certificate must name the host of the URL (a DNS name or
// an IP address in its subjectAltName).
struct StoreCredentials {
  std::string user, password;
  bool tls = false;  // set from the address by connect_store
  std::string tls_ca, tls_cert, tls_key;
};
// InvalidArgument naming the variable for a password file that is not a
// readable regular file, is empty, or is over 4 KiB, and for a TLS file
// that is not a readable regular file (or a certificate without its key).
Result<StoreCredentials> store_credentials_from_env();

// A client of the store at `a`, retrying the connection until
// `connect_timeout` (the server may be starting); `timeout` is each later
// operation's deadline; Redis and etcd authenticate with
// store_credentials_from_env(). Errors: unreachable (Unavailable, one line
// naming the address and the reason), a server that refuses, credentials
// included (InvalidArgument).
Result<std::unique_ptr<Store>> connect_store(const StoreAddress& a, std::chrono::milliseconds connect_timeout,
                                             std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace tessera::comm
