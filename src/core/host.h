// This process's host name as Tessera reports it: in error lines ("on host
// ..."), checkpoint locks, metrics labels and the elastic agent's id.
// Thread safety: may be called from any thread.
#pragma once

#include <string>

namespace tessera {

// TESSERA_HOST when set and not empty (the emulated cluster's hosts share
// one kernel host name, so scripts/cluster.sh and `tessera launch` set it per
// network namespace), else gethostname(), else "unknown".
std::string host_name();

}  // namespace tessera
