#include "ckpt/checkpointer.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>

#include "ckpt/manifest.h"
#include "core/check.h"
#include "obs/trace.h"

namespace tessera::ckpt {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Point-to-point tags of the publish protocol (below MPI's guaranteed 32767).
constexpr int kTagShardJson = 7301;
constexpr int kTagFailure = 7302;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

Status rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    return Status::IOError(fmt::format("{}: cannot rename to {}: {}", from, to, std::strerror(errno)));
  return Status::OK();
}

// Everything the pieces need to be written, checked on the writer thread.
Status check_pieces(std::span<const std::string_view> names) {
  std::vector<std::string_view> sorted(names.begin(), names.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); i++) {
    if (sorted[i].empty() || sorted[i] == "__metadata__")
      return Status::InvalidArgument(fmt::format("piece name '{}' is reserved", sorted[i]));
    if (i > 0 && sorted[i] == sorted[i - 1])
      return Status::InvalidArgument(fmt::format("two pieces named '{}'", sorted[i]));
  }
  return Status::OK();
}

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)) {
  CHECK(options_.keep >= 0);
  writer_ = std::thread([this] { writer_loop(); });
}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

std::string Checkpointer::tmp_dir(int64_t step) const {
  return fmt::format("{}/.tmp-{}", options_.dir, step_dir_name(step));
}

Status Checkpointer::grow_staging(size_t floats) {
  if (staging_.size() >= floats) return Status::OK();
  try {
    staging_.resize(floats);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(fmt::format("cannot allocate the {:.1f} MB checkpoint staging buffer: out of memory",
                                                 static_cast<double>(floats) * sizeof(float) / 1e6));
  }
  return Status::OK();
}

Result<bool> Checkpointer::save(comm::Communicator& world, int64_t step, std::span<const SavePiece> pieces,
                                std::string_view state) {
  const auto t0 = Clock::now();
  if (pending_) {
    if (options_.on_busy == OnBusy::kSkip) return false;
    // If a deferred result was never polled, the newer one replaces it.
    ASSIGN_OR_RETURN(PollResult previous, complete(world, /*wait_for_it=*/true));
    deferred_ = std::move(previous);
  }
  // Invariant: no save pending => the writer is idle, so its inputs are ours.
  Status bad;
  if (step < 0) bad = Status::InvalidArgument(fmt::format("step {} is negative", step));
  size_t total = 0;
  staged_.resize(pieces.size());  // keeps the elements (and their strings' capacity) of the last save
  for (size_t i = 0; i < pieces.size() && bad.ok(); i++) {
    const SavePiece& p = pieces[i];
    if (Status st = check_slice(p.slice); !st.ok()) bad = st.With(fmt::format("piece '{}'", p.name));
    else if (p.data == nullptr && p.slice.numel() > 0) bad = Status::InvalidArgument(fmt::format("piece '{}' has no data", p.name));
    if (!bad.ok()) break;
    staged_[i].name = p.name;
    staged_[i].slice = p.slice;
    staged_[i].offset = total;
    total += static_cast<size_t>(p.slice.numel());
  }
  if (bad.ok()) bad = grow_staging(total);  // the first save (or a bigger one) allocates
  if (bad.ok()) {
    obs::trace::Span span("checkpoint stage", "checkpoint", {{"bytes", static_cast<int64_t>(total * sizeof(float))}});
    for (size_t i = 0; i < pieces.size(); i++)
      if (pieces[i].slice.numel() > 0)
        std::memcpy(staging_.data() + staged_[i].offset, pieces[i].data, pieces[i].slice.numel() * sizeof(float));
    job_floats_ = total;
    rank_state_.assign(state);
    job_step_ = step;
    job_rank_ = world.rank();
    job_fault_ = options_.fault_errno;
  }
  {
    std::lock_guard lock(mu_);
    if (bad.ok()) {
      writer_state_ = WriterState::kWriting;
    } else {  // reported by poll, so every rank stays in step
      write_error_ = bad;
      writer_state_ = WriterState::kFailed;
    }
  }
  cv_.notify_all();
  pending_ = true;
  pending_step_ = step;
  stall_ms_ = seconds_since(t0) * 1e3;
  return true;
}

void Checkpointer::writer_loop() {
  obs::trace::set_thread_name("checkpoint writer");
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || writer_state_ == WriterState::kWriting; });
    if (writer_state_ != WriterState::kWriting) return;  // stopping, nothing in flight
    lock.unlock();
    const auto t0 = Clock::now();
    Status st;
    obs::trace::Span span("checkpoint write", "checkpoint", {{"ckpt_step", job_step_}});
    try {
      st = write_shard();
    } catch (const std::exception& e) {  // e.g. bad_alloc: a failed save, not a dead process
      st = Status::Internal(fmt::format("writing the shard failed: {}", e.what()));
    }
    write_s_ = seconds_since(t0);
    span.arg("bytes", static_cast<int64_t>(bytes_rank_));
    span.arg("ok", st.ok() ? 1 : 0);
    if (!st.ok()) write_error_ = st;
    lock.lock();
    writer_state_ = st.ok() ? WriterState::kDurable : WriterState::kFailed;
    cv_.notify_all();
  }
}

Status Checkpointer::write_shard() {
  const std::string dir = tmp_dir(job_step_);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError(fmt::format("{}: cannot create folder: {}", dir, ec.message()));
  std::vector<std::string_view> names;
  for (const StagedPiece& p : staged_) names.push_back(p.name);
  RETURN_IF_ERROR(check_pieces(names));

  // The safetensors header: the state, then the pieces in order, back to back.
  nlohmann::ordered_json header;
  header["__metadata__"] = {{kStateKey, rank_state_}};
  uint64_t data_bytes = 0;
  for (const StagedPiece& p : staged_) {
    const TensorSlice& s = p.slice;
    const uint64_t nbytes = static_cast<uint64_t>(s.numel()) * sizeof(float);
    // A whole block keeps its shape; a flat range of one is stored 1-D.
    const bool whole = s.flat_begin == 0 && (s.flat_end < 0 || s.flat_end == s.block_numel());
    header[p.name] = {{"dtype", "F32"},
                      {"shape", whole ? s.size : std::vector<int64_t>{s.numel()}},
                      {"data_offsets", {data_bytes, data_bytes + nbytes}}};
    data_bytes += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    return Status::InvalidArgument("a piece name or the rank state is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // 8-byte aligned data, as the reference writer does
  const uint64_t header_len = text.size();
  const uint64_t data_start = 8 + header_len;

  ShardRecord rec;
  rec.file = shard_file_name(job_rank_);
  rec.rank = job_rank_;
  rec.bytes = data_start + data_bytes;
  rec.state_xxh64 = XXH64(rank_state_.data(), rank_state_.size(), 0);
  const std::byte* data = reinterpret_cast<const std::byte*>(staging_.data());
  for (const StagedPiece& p : staged_) {
    PieceRecord r;
    r.name = p.name;
    r.slice = p.slice;
    if (r.slice.flat_end < 0) r.slice.flat_end = r.slice.block_numel();
    r.offset = data_start + p.offset * sizeof(float);
    r.bytes = static_cast<uint64_t>(r.slice.numel()) * sizeof(float);
    r.xxh64 = XXH64(data + p.offset * sizeof(float), r.bytes, 0);
    rec.pieces.push_back(std::move(r));
  }
  const std::span<const std::byte> parts[] = {std::as_bytes(std::span(&header_len, 1)), bytes_of(text),
                                              std::span(data, data_bytes)};
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(), &XXH64_freeState);
  CHECK(hash != nullptr);
  XXH64_reset(hash.get(), 0);
  for (auto part : parts) XXH64_update(hash.get(), part.data(), part.size());
  rec.xxh64 = XXH64_digest(hash.get());

  const std::string path = dir + "/" + rec.file;
  FaultEnv fault(env(), job_fault_);
  Env& out = job_fault_ != 0 ? static_cast<Env&>(fault) : env();
  RETURN_IF_ERROR(out.write_file(path, parts));
  RETURN_IF_ERROR(sync_dir(dir));
  shard_json_ = shard_to_json(rec).dump();
  bytes_rank_ = rec.bytes;
  return Status::OK();
}

Result<PollResult> Checkpointer::poll(comm::Communicator& world, bool wait_for_it) {
  if (deferred_) {
    PollResult r = std::move(*deferred_);
    deferred_.reset();
    return r;
  }
  return complete(world, wait_for_it);
}

Result<PollResult> Checkpointer::complete(comm::Communicator& world, bool wait_for_it) {
  PollResult result;
  if (!pending_) return result;
  result.step = pending_step_;
  WriterState ws;
  {
    std::unique_lock lock(mu_);
    if (wait_for_it) cv_.wait(lock, [&] { return writer_state_ != WriterState::kWriting; });
    ws = writer_state_;
  }
  const int rank = world.rank(), size = world.size();
  // {every rank done, lowest failed rank (size if none)}
  int64_t agree[2] = {ws == WriterState::kWriting ? 0 : 1, ws == WriterState::kFailed ? rank : size};
  RETURN_IF_ERROR(world.all_reduce(agree, agree, 2, comm::ElemType::kI64, comm::ReduceOp::kMin));
  if (agree[0] == 0) {
    result.state = SaveState::kPending;
    return result;
  }
  // Every writer is done: rank 0 decides, then tells everyone
  // {status code, total bytes, message length} and the message.
  const int failed_rank = static_cast<int>(agree[1]);
  int64_t outcome[3] = {0, 0, 0};
  std::string message;
  if (failed_rank < size) {
    int64_t failure[2] = {0, 0};  // {code, message length}, from the failed rank to rank 0
    if (rank == failed_rank) {
      message = fmt::format("rank {}: {}", rank, write_error_.message());
      failure[0] = static_cast<int64_t>(write_error_.code());
      failure[1] = static_cast<int64_t>(message.size());
    }
    if (failed_rank != 0 && rank == failed_rank) {
      RETURN_IF_ERROR(world.send(failure, sizeof(failure), 0, kTagFailure));
      RETURN_IF_ERROR(world.send(message.data(), failure[1], 0, kTagFailure));
    } else if (failed_rank != 0 && rank == 0) {
      RETURN_IF_ERROR(world.recv(failure, sizeof(failure), failed_rank, kTagFailure));
      message.resize(static_cast<size_t>(failure[1]));
      RETURN_IF_ERROR(world.recv(message.data(), failure[1], failed_rank, kTagFailure));
    }
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp_dir(pending_step_), ec);
      if (ec) message += fmt::format(" (and {} could not be removed: {})", tmp_dir(pending_step_), ec.message());
      outcome[0] = failure[0];
    }
  } else {
    int64_t mine = static_cast<int64_t>(shard_json_.size());
    std::vector<int64_t> lengths(size);
    RETURN_IF_ERROR(world.all_gather(&mine, lengths.data(), 1, comm::ElemType::kI64));
    if (rank == 0) {
      std::vector<std::string> shards(size);
      shards[0] = shard_json_;
      std::vector<std::unique_ptr<comm::Work>> recvs;
      for (int r = 1; r < size; r++) {
        shards[r].resize(static_cast<size_t>(lengths[r]));
        recvs.push_back(world.recv_async(shards[r].data(), lengths[r], r, kTagShardJson));
      }
      for (auto& w : recvs) RETURN_IF_ERROR(w->wait());
      uint64_t total = 0;
      Status st = publish(shards, &total, &message);
      if (!st.ok()) message = st.message();
      outcome[0] = static_cast<int64_t>(st.code());
      outcome[1] = static_cast<int64_t>(total);
    } else {
      RETURN_IF_ERROR(world.send(shard_json_.data(), mine, 0, kTagShardJson));
    }
  }
  outcome[2] = static_cast<int64_t>(message.size());
  RETURN_IF_ERROR(world.broadcast(outcome, 3, comm::ElemType::kI64, 0));
  message.resize(static_cast<size_t>(outcome[2]));
  if (outcome[2] > 0) RETURN_IF_ERROR(world.broadcast(message.data(), outcome[2], comm::ElemType::kU8, 0));

  const auto code = static_cast<StatusCode>(outcome[0]);
  result.stats.stall_ms = stall_ms_;
  if (code == StatusCode::kOk) {
    result.state = SaveState::kPublished;
    result.warning = message;
    result.stats.bytes_rank = bytes_rank_;
    result.stats.bytes_total = static_cast<uint64_t>(outcome[1]);
    result.stats.write_s = write_s_;
    result.stats.write_mb_s = write_s_ > 0 ? bytes_rank_ / write_s_ / 1e6 : 0;
  } else {
    result.state = SaveState::kFailed;
    const std::string line = fmt::format("checkpoint step {}: {}", pending_step_, message);
    result.error = code == StatusCode::kInvalidArgument ? Status::InvalidArgument(line)
                   : code == StatusCode::kCorruption    ? Status::Corruption(line)
                                                        : Status::IOError(line);
  }
  {
    std::lock_guard lock(mu_);
    writer_state_ = WriterState::kIdle;
  }
  pending_ = false;
  return result;
}

Status Checkpointer::publish(const std::vector<std::string>& shard_json, uint64_t* total_bytes,
                             std::string* warning) {
  obs::trace::Span span("checkpoint publish", "checkpoint", {{"ckpt_step", pending_step_}});
  const std::string tmp = tmp_dir(pending_step_);
  const std::string& root = options_.dir;
  const std::string name = step_dir_name(pending_step_);
  const std::string final_dir = root + "/" + name;
  Status st = [&]() -> Status {
    Manifest m;
    m.step = pending_step_;
    m.world_size = static_cast<int>(shard_json.size());
    m.config = options_.config;
    m.layout = options_.layout;
    for (size_t r = 0; r < shard_json.size(); r++) {
      const nlohmann::json j = nlohmann::json::parse(shard_json[r], nullptr, /*allow_exceptions=*/false);
      Result<ShardRecord> s = shard_from_json(j);
      if (!s.ok()) return Status::Internal(fmt::format("rank {} sent a bad shard description: {}", r, s.status().message()));
      *total_bytes += s->bytes;
      m.shards.push_back(std::move(s).value());
    }
    std::string text;
    try {
      text = manifest_to_json(m).dump(1) + "\n";
    } catch (const nlohmann::json::exception&) {
      return Status::InvalidArgument("the config or layout JSON holds a string that is not valid UTF-8");
    }
    const std::span<const std::byte> manifest_parts[] = {bytes_of(text)};
    RETURN_IF_ERROR(env().write_file(tmp + "/" + kManifestFile, manifest_parts));
    RETURN_IF_ERROR(sync_dir(tmp));
    // Saving a step that was published before (a resumed run) replaces it.
    const std::string old = root + "/.old-" + name;
    std::error_code ec;
    bool moved_aside = false;
    if (fs::exists(final_dir, ec)) {
      fs::remove_all(old, ec);
      RETURN_IF_ERROR(rename_path(final_dir, old));
      moved_aside = true;
    }
    if (Status renamed = rename_path(tmp, final_dir); !renamed.ok()) {
      if (moved_aside) (void)rename_path(old, final_dir);
      return renamed;
    }
    const std::string latest = root + "/" + kLatestFile;
    const std::string pointer = name + "\n";
    const std::span<const std::byte> latest_parts[] = {bytes_of(pointer)};
    Status pointed = sync_dir(root);
    if (pointed.ok()) pointed = env().write_file(latest + ".tmp", latest_parts);
    if (pointed.ok()) pointed = rename_path(latest + ".tmp", latest);
    if (!pointed.ok()) {
      // `latest` still names the previous checkpoint, so the new step folder
      // is a whole checkpoint's worth of disk that nothing points to (and
      // that pruning, which counts from `latest`, would keep): on a full
      // disk it kept the disk full. Take it back, and the step it replaced.
      std::error_code rm_ec;
      fs::remove(latest + ".tmp", rm_ec);
      fs::remove_all(final_dir, rm_ec);
      if (!rm_ec && moved_aside) (void)rename_path(old, final_dir);
      (void)sync_dir(root);
      if (rm_ec)
        return Status::IOError(
            fmt::format("{} (and {} could not be removed: {})", pointed.message(), final_dir, rm_ec.message()));
      return pointed;
    }
    RETURN_IF_ERROR(sync_dir(root));
    fs::remove_all(old, ec);
    return Status::OK();
  }();
  if (!st.ok()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // no-op once renamed: a complete step folder stays, `latest` is unchanged
    return st;
  }

  // Prune, only now that `latest` names the new checkpoint: step folders
  // beyond the newest `keep` (never the one just published), and tmp
  // folders of saves that never completed (only one save is ever pending).
  std::error_code ec;
  std::map<int64_t, fs::path> steps;
  std::vector<fs::path> stale;
  std::error_code list_ec;
  for (fs::directory_iterator it(root, list_ec), end; !list_ec && it != end; it.increment(list_ec)) {
    const std::string file = it->path().filename().string();
    if (std::optional<int64_t> s = parse_step_dir_name(file); s && it->is_directory(ec)) steps.emplace(*s, it->path());
    else if (file.rfind(".tmp-step-", 0) == 0) stale.push_back(it->path());
  }
  if (list_ec) *warning = fmt::format("{}: cannot list: {}", root, list_ec.message());
  if (options_.keep > 0) {
    int excess = static_cast<int>(steps.size()) - options_.keep;
    for (auto it = steps.begin(); excess > 0 && it != steps.end(); ++it) {
      if (it->first == pending_step_) continue;
      stale.push_back(it->second);
      excess--;
    }
  }
  for (const fs::path& p : stale) {
    fs::remove_all(p, ec);
    if (ec) *warning += fmt::format("{}{}: cannot remove: {}", warning->empty() ? "" : "; ", p.string(), ec.message());
  }
  return Status::OK();
}

}  // namespace tessera::ckpt
