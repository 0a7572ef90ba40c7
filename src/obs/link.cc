#include "obs/link.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace tessera::obs {

namespace {

// The interface of the default route (destination 0), or "".
std::string default_route_interface(const std::string& root) {
  std::ifstream f(root + "/proc/net/route");
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string iface, dest;
    if (in >> iface >> dest && dest == "00000000") return iface;
  }
  return "";
}

// The only interface in /sys/class/net besides lo, or "".
std::string only_interface(const std::string& root) {
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(root + "/sys/class/net", ec)) {
    const std::string n = e.path().filename().string();
    if (n != "lo") names.push_back(n);
  }
  return names.size() == 1 ? names[0] : "";
}

}  // namespace

LinkSpeed detect_link_speed(double configured_gbps, const std::string& root) {
  LinkSpeed s;
  if (configured_gbps > 0) {
    s.bytes_per_second = configured_gbps * 1e9 / 8;
    s.source = "log.link_gbps";
    return s;
  }
  std::string iface = default_route_interface(root);
  if (iface.empty()) iface = only_interface(root);
  if (iface.empty()) return s;
  std::ifstream f(root + "/sys/class/net/" + iface + "/speed");
  long long mbit = 0;
  if (!(f >> mbit) || mbit <= 0) return s;  // -1 or unreadable: the driver does not know
  s.bytes_per_second = static_cast<double>(mbit) * 1e6 / 8;
  s.source = "sysfs:" + iface;
  return s;
}

}  // namespace tessera::obs
