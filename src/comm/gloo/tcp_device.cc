#include "comm/gloo/tcp_device.h"

#include <exception>

#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/pair.h>
#include <gloo/transport/tcp/unbound_buffer.h>

namespace tessera::comm {

namespace {

namespace tcp = gloo::transport::tcp;

// tcp::UnboundBuffer::signalException is protected (its friend is Gloo's
// own Pair); a member pointer named through a derived class reaches it.
struct WakeBuffer : tcp::UnboundBuffer {
  static void fail(tcp::UnboundBuffer& b, std::exception_ptr ex) { (b.*&WakeBuffer::signalException)(ex); }
};

class Pair final : public tcp::Pair {
 public:
  using tcp::Pair::Pair;

 protected:
  // Gloo moves a pair to CLOSED with its error set (ex_) from
  // signalException, holding the pair's lock, after it woke the waits it
  // knows of; the unbound sends still queued in tx_ are the ones it skips.
  void changeState(state next) noexcept override {
    if (next == CLOSED && ex_ != nullptr) {
      for (tcp::Op& op : tx_) {
        if (op.getOpcode() != tcp::Op::SEND_UNBOUND_BUFFER) continue;
        gloo::NonOwningPtr<tcp::UnboundBuffer> buf(op.ubuf);
        if (buf) WakeBuffer::fail(*buf.operator->(), ex_);
      }
    }
    tcp::Pair::changeState(next);
  }
};

class Context final : public tcp::Context {
 public:
  using tcp::Context::Context;
  // As tcp::Context::createPair, with the pair above.
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override {
    pairs_[rank] = std::make_unique<Pair>(this, device_.get(), rank, getTimeout());
    return pairs_[rank];
  }
};

class Device final : public tcp::Device {
 public:
  using tcp::Device::Device;
  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override {
    return std::make_shared<Context>(shared_from_this(), rank, size);
  }
};

}  // namespace

std::shared_ptr<gloo::transport::Device> make_tcp_device(const std::string& host) {
  tcp::attr attr(host.c_str());
  return std::make_shared<Device>(tcp::CreateDeviceAttr(attr));
}

}  // namespace tessera::comm
