// The speed of the network link a rank's inter-host traffic crosses, for
// comparing achieved bus bandwidth with it (docs/monitoring.md, "Network").
//
// Where it comes from, first found wins:
//   1. the configured figure (`log.link_gbps`, Gbit/s), source "log.link_gbps";
//   2. the interface of the default route in /proc/net/route, else the only
//      non-loopback interface in /sys/class/net, and its
//      /sys/class/net/<iface>/speed (Mbit/s, as the driver reports it; a
//      virtual interface reports a nominal figure, veth 10000), source
//      "sysfs:<iface>";
//   3. unknown: 0 bytes/s, source "unknown".
// Only Linux's files are read; nothing is probed on the wire.
#pragma once

#include <string>

namespace tessera::obs {

struct LinkSpeed {
  double bytes_per_second = 0;  // 0: unknown
  std::string source = "unknown";
  bool known() const { return bytes_per_second > 0; }
};

// root: prefix of /proc and /sys (tests point it at a fake tree).
LinkSpeed detect_link_speed(double configured_gbps, const std::string& root = "");

}  // namespace tessera::obs
