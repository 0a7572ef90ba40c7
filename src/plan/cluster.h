// A cluster file (TOML; docs/planner.md "Cluster files"): node type and
// count, the profile or catalogue entry, links inside and between nodes,
// price. Examples in examples/clusters/.
#pragma once

#include <string>

#include "core/status.h"
#include "plan/hardware.h"

namespace tessera::plan {

struct Cluster {
  std::string name;           // `name`, or the file's stem
  std::string file;
  NodeType node;
  int nodes = 1;
  int ranks_per_node = 1;     // GPUs per node; ranks per CPU node (they share its cores)
  LinkModel intra;            // busbw per device inside a node
  LinkModel inter;            // busbw per node (all its NICs) between nodes; kind "none" with one node
  double price_per_hour = 0;  // USD per node-hour
  // The emulated cluster of scripts/cluster.sh: the "nodes" are network
  // namespaces of one machine, so every rank shares its cores and memory.
  bool shared_host = false;
  // CPU: OpenMP threads per rank (0: cores / ranks per node, as `tessera
  // launch` sets them). A rank's share of the node is threads / cores, less
  // when the node's ranks want more threads than it has cores.
  int threads_per_rank = 0;

  int ranks() const { return nodes * ranks_per_node; }
  std::string str() const;  // "2 x A100-80GB (8 per node), nvlink3 inside, 25 Gbit/s ethernet x1 between, $32.77/node-hour"
};

// Reads and checks a cluster file; a relative profile path is taken from the
// file's folder. Errors are one line naming the file and the key.
Result<Cluster> load_cluster(const std::string& path);

}  // namespace tessera::plan
