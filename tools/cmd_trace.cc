// tessera trace merge: the per-rank timeline files of a `tessera train
// --trace DIR` run on one clock, in one file (docs/monitoring.md).
#include <cstdio>
#include <filesystem>

#include "io/file.h"
#include "obs/trace_merge.h"
#include "tools/commands.h"

namespace tessera::tools {

namespace {

struct MergeArgs {
  std::string dir, out;
};

int run_merge(const MergeArgs& a) {
  const std::string out = a.out.empty() ? a.dir + "/trace.json" : a.out;
  // The folder first: checking --out creates its folder, which must not
  // make a mistyped DIR exist.
  std::error_code ec;
  if (!std::filesystem::is_directory(a.dir, ec))
    return fail(Status::NotFound(a.dir + ": no such folder (the --trace DIR of a training run)"));
  if (Status st = io::check_writable_file(out); !st.ok()) return fail(st.With("--out"));
  auto r = obs::trace::merge_trace_dir(a.dir, out);
  if (!r.ok()) return fail(r.status());
  std::string ranks;
  for (int rank : r->ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(rank);
  std::printf("merged %zu rank(s) (%s), %zu events, on rank 0's clock (offsets within +-%.1f us) into %s; open it in "
              "https://ui.perfetto.dev or chrome://tracing\n",
              r->ranks.size(), ranks.c_str(), r->events, r->max_clock_error_us, out.c_str());
  return kExitOk;
}

}  // namespace

void add_trace_command(CLI::App& app) {
  CLI::App* trace = app.add_subcommand("trace", "Timeline traces of `tessera train --trace DIR`");
  trace->require_subcommand(1);
  auto a = std::make_shared<MergeArgs>();
  CLI::App* merge = trace->add_subcommand("merge", "Merge the ranks' trace-rank-N.json on rank 0's clock into one file");
  merge->add_option("dir", a->dir, "the --trace folder")->required();
  merge->add_option("--out", a->out, "the merged trace-event JSON (default DIR/trace.json)");
  merge->callback([a] { exit_code() = run_merge(*a); });
}

}  // namespace tessera::tools
