// The shm communicator's ops; see comm.hpp for the protocol.
#include "comm.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <sched.h>

#include "../common/spin.hpp"
#include "placement.hpp"

namespace commlayer::shm {

namespace {

constexpr std::size_t kAlignElements = 16;  // slice boundaries, so each slice starts vector-aligned
constexpr int kPollsPerClockCheck = 64;
constexpr double kLivenessPeriodS = 0.02;
// all_reduce splits the reduction across ranks (two steps) above this size, not just above
// small_bytes: from 8 KiB on that beat one step in which every rank reduces every copy (2 ranks,
// 64 KiB: 3.8 against 6.1 us; 4 ranks on 2 cores: no worse).
constexpr std::size_t kAllReduceSmallBytes = 4096;
constexpr int kSharedCpuSpins = 16;              // a peer on this CPU cannot arrive while this rank spins
constexpr std::int64_t kMoveIntervalNs = 10000000;  // at most one move to another CPU per 10 ms
constexpr std::uint32_t kDeparted = 2;  // Control::failed of a rank whose process is exiting (depart())

using common::cpu_relax;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// Whether `pid` has exited (a zombie counts: its memory is gone, it will never arrive).
bool process_gone(pid_t pid) {
    if (pid <= 0) return false;
    if (::kill(pid, 0) != 0) return errno == ESRCH;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
    std::FILE* file = std::fopen(path, "r");
    if (file == nullptr) return false;
    char state = 0;
    const int read = std::fscanf(file, "%*d (%*[^)]) %c", &state);
    std::fclose(file);
    return read == 1 && (state == 'Z' || state == 'X');
}

// Signature layout: kind (4 bits) | dtype (4) | reduce op (4) | root + 1 (12) | element count (40).
enum Kind : int { kBarrier = 0, kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll };
// The facade's names of the ops each kind serves.
constexpr const char* kKindNames[] = {"barrier",           "all_reduce",           "broadcast",
                                      "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"};
constexpr const char* kDTypeNames[] = {"float32", "float64", "bfloat16", "float16", "int8",
                                       "uint8",   "int32",   "int64",    "bool"};
constexpr const char* kOpNames[] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor"};
constexpr std::uint64_t kCountMask = (std::uint64_t{1} << 40) - 1;

std::uint64_t pack_signature(int kind, std::size_t count, DType dtype, int reduce_op, int root) {
    return (std::uint64_t(kind) << 60) | (std::uint64_t(static_cast<int>(dtype) & 15) << 56) |
           (std::uint64_t((reduce_op + 1) & 15) << 52) | (std::uint64_t((root + 1) & 0xfff) << 40) |
           (std::uint64_t(count) & kCountMask);
}

// "all_reduce(float32[8], op sum)", "broadcast(int64[4], root 1)", "barrier()".
// A duration as people write it ("3 s", "1 min 30 s"), matching commlayer.core.metrics.format_duration.
std::string describe_duration(double seconds) {
    char text[48];
    if (seconds < 1) {
        std::snprintf(text, sizeof text, "%.3g ms", seconds * 1000);
        return text;
    }
    if (seconds < 60) {
        std::snprintf(text, sizeof text, "%.3g s", seconds);
        return text;
    }
    const long whole = static_cast<long>(seconds + 0.5);
    const long minutes = whole / 60, rest = whole % 60;
    if (rest == 0) std::snprintf(text, sizeof text, "%ld min", minutes);
    else std::snprintf(text, sizeof text, "%ld min %ld s", minutes, rest);
    return text;
}

std::string describe_signature(std::uint64_t signature) {
    const int kind = static_cast<int>(signature >> 60);
    if (kind > kAllToAll) return "an unknown op";
    if (kind == kBarrier) return "barrier()";
    const int dtype = static_cast<int>((signature >> 56) & 15);
    const int reduce_op = static_cast<int>((signature >> 52) & 15) - 1;
    const int root = static_cast<int>((signature >> 40) & 0xfff) - 1;
    std::string text = std::string(kKindNames[kind]) + "(" + (dtype < 9 ? kDTypeNames[dtype] : "?") + "[" +
                       std::to_string(signature & kCountMask) + "]";
    if (reduce_op >= 0 && reduce_op < 8) text += std::string(", op ") + kOpNames[reduce_op];
    if (root >= 0) text += ", root " + std::to_string(root);
    return text + ")";
}

// [lo, hi) of slice `index` when `count` elements are split over `parts` ranks.
struct Slice {
    std::size_t lo, len;
};
Slice slice_of(std::size_t count, int parts, int index) {
    std::size_t base = (count + parts - 1) / parts;
    base = (base + kAlignElements - 1) / kAlignElements * kAlignElements;
    const std::size_t lo = std::min(count, base * static_cast<std::size_t>(index));
    return {lo, std::min(base, count - lo)};
}

// Runs the slow-wait hooks around a scope (released GIL while yielding).
class HookScope {
public:
    explicit HookScope(const SlowWaitHooks& hooks) : hooks_(hooks) {
        if (hooks_.begin) hooks_.begin();
    }
    ~HookScope() {
        if (hooks_.end) hooks_.end();
    }
    HookScope(const HookScope&) = delete;
    HookScope& operator=(const HookScope&) = delete;

private:
    const SlowWaitHooks& hooks_;
};

}  // namespace

struct alignas(64) Comm::Control {
    std::atomic<std::uint64_t> step;
    std::atomic<std::uint64_t> signature[2];  // of the op at step s, in slot s & 1
    char pad_step[40];
    std::atomic<std::uint32_t> failed;  // 1: the rank gave up, kDeparted: it is exiting; peers stop waiting
    std::atomic<std::int32_t> cpu;      // 1 + the CPU the rank last waited on; 0: not known yet
    char pad_failed[56];
};

std::size_t Layout::region_bytes() const {
    const std::size_t bytes = control_bytes + 2 * small_bytes + 2 * chunk_bytes;
    return (bytes + 4095) / 4096 * 4096;
}

Comm::Comm(std::string group, std::vector<int> ranks, int rank, int size, std::vector<char*> regions,
           std::vector<pid_t> pids, Layout layout, WaitPolicy policy)
    : group_(std::move(group)),
      label_("shm group '" + group_ + "'"),
      ranks_(std::move(ranks)),
      rank_(rank),
      size_(size),
      regions_(std::move(regions)),
      pids_(std::move(pids)),
      layout_(layout),
      policy_(policy),
      inputs_(static_cast<std::size_t>(size)) {
    static_assert(sizeof(Control) <= Layout::control_bytes, "control block too large");
    static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "cross-process atomics must be lock-free");
    if (size < 1 || rank < 0 || rank >= size || regions_.size() != static_cast<std::size_t>(size) ||
        pids_.size() != static_cast<std::size_t>(size) || ranks_.size() != static_cast<std::size_t>(size)) {
        throw std::invalid_argument("shm: inconsistent communicator arguments for " + label_);
    }
    step_ = control(rank_)->step.load(std::memory_order_relaxed);
}

Comm::Control* Comm::control(int peer) const { return reinterpret_cast<Control*>(regions_[peer]); }

char* Comm::small(int peer, std::uint64_t step) const {
    return regions_[peer] + Layout::control_bytes + (step & 1u) * layout_.small_bytes;
}

char* Comm::stage(int peer) const { return regions_[peer] + Layout::control_bytes + 2 * layout_.small_bytes; }

char* Comm::result(int peer) const { return stage(peer) + layout_.chunk_bytes; }

void Comm::check_usable(const char* op) const {
    if (!failure_.empty()) {
        throw PeerError(std::string(op) + ": " + label_ + " is unusable after an earlier failure: " + failure_);
    }
}

void Comm::fail(const std::string& message, bool timeout) {
    failure_ = message;
    control(rank_)->failed.store(1, std::memory_order_release);
    if (timeout) throw TimeoutError(message);
    throw PeerError(message);
}

void Comm::begin(const char* op, int kind, std::size_t count, DType dtype, int reduce_op, int root) {
    check_usable(op);
    signature_ = pack_signature(kind, count, dtype, reduce_op, root);
}

void Comm::arrive_and_wait(const char* op) {
    ++step_;
    Control* mine = control(rank_);
    mine->signature[step_ & 1u].store(signature_, std::memory_order_relaxed);
    mine->step.store(step_, std::memory_order_release);  // publishes the signature too
    for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        wait_for(peer, step_, op);
        check_signature(peer, step_, op);
    }
}

// The peer's slot for `step` is rewritten only at step + 2, which needs this rank at step + 1.
void Comm::check_signature(int peer, std::uint64_t step, const char* op) const {
    const std::uint64_t theirs = control(peer)->signature[step & 1u].load(std::memory_order_relaxed);
    if (theirs == signature_) return;
    // The text every backend's check gives (commlayer/contract/mismatch/signature.py).
    throw MismatchError(std::string(op) + " on group '" + group_ + "': the ranks called different collectives: rank " +
                        std::to_string(ranks_[rank_]) + " called " + describe_signature(signature_) +
                        ", peer rank " + std::to_string(ranks_[peer]) + " called " + describe_signature(theirs) +
                        "; checked by shm before any data moved");
}

void Comm::wait_for(int peer, std::uint64_t step, const char* op) {
    const std::atomic<std::uint64_t>& counter = control(peer)->step;
    const int spins = sharing_cpu_ ? std::min(kSharedCpuSpins, policy_.spins) : policy_.spins;
    for (int i = 0; i < spins; ++i) {
        if (counter.load(std::memory_order_acquire) >= step) return;
        cpu_relax();
    }
    sharing_cpu_ = settle_placement(peer);
    HookScope released(hooks_);
    const Clock::time_point start = Clock::now();
    double next_liveness_check = kLivenessPeriodS;
    for (long polls = 1;; ++polls) {
        if (counter.load(std::memory_order_acquire) >= step) return;
        sched_yield();
        if (polls % kPollsPerClockCheck != 0) continue;
        const double waited = seconds_since(start);
        const std::string where = std::string(op) + ": " + label_ + ", rank " + std::to_string(rank_) + ": ";
        if (interrupted_->load(std::memory_order_relaxed)) {
            fail(where + "stopped waiting for peer rank " + std::to_string(peer) +
                     ": the peer monitor reported that a rank of the job exited",
                 false);
        }
        const std::uint32_t failed = control(peer)->failed.load(std::memory_order_acquire);
        if (failed == kDeparted) fail(where + exited(peer), false);
        if (failed != 0) {
            fail(where + "peer rank " + std::to_string(peer) + " failed during an earlier or the same op", false);
        }
        const bool timed_out = waited >= policy_.timeout_s;
        if (waited >= next_liveness_check || timed_out) {
            next_liveness_check = waited + kLivenessPeriodS;
            // Checked once more at the deadline: a peer that exited is a peer failure, not a timeout.
            if (process_gone(pids_[peer])) fail(where + exited(peer), false);
        }
        if (timed_out) {
            fail(where + "peer rank " + std::to_string(peer) + " did not arrive within the group's timeout of " +
                     describe_duration(policy_.timeout_s) + " (it is stuck, or called a different op)",
                 true);
        }
    }
}

// The facade turns this wording ("peer rank N ... exited") into a PeerFailureError.
std::string Comm::exited(int peer) const {
    return "peer rank " + std::to_string(peer) + " (pid " + std::to_string(pids_[peer]) +
           ") exited while this rank waited for it";
}

void Comm::depart() {
    std::uint32_t idle = 0;  // a rank that already failed keeps saying so
    control(rank_)->failed.compare_exchange_strong(idle, kDeparted, std::memory_order_release);
}

// Publishes this rank's CPU; true if `peer` was last seen on it and this rank stays there (the
// higher rank of the pair moves, to a CPU no rank of the group was seen on, if there is one).
bool Comm::settle_placement(int peer) {
    const int cpu = current_cpu();
    if (cpu < 0) return false;
    control(rank_)->cpu.store(cpu + 1, std::memory_order_relaxed);
    if (control(peer)->cpu.load(std::memory_order_relaxed) != cpu + 1) return false;
    const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 Clock::now().time_since_epoch()).count();
    if (rank_ < peer || now - last_move_ns_ < kMoveIntervalNs) return true;
    last_move_ns_ = now;
    std::vector<int> taken;  // slow path only: this rank is about to yield anyway
    for (int rank = 0; rank < size_; ++rank) taken.push_back(control(rank)->cpu.load(std::memory_order_relaxed) - 1);
    const int target = free_cpu(taken);
    if (target < 0 || !move_to_cpu(target)) return true;
    control(rank_)->cpu.store(target + 1, std::memory_order_relaxed);
    return false;
}

void Comm::barrier() {
    begin("barrier", kBarrier, 0, DType::f32, -1, -1);
    arrive_and_wait("barrier");
}

// --- all_reduce ----------------------------------------------------------------------------

void Comm::all_reduce(void* data, std::size_t count, DType dtype, Op op) {
    begin("all_reduce", kAllReduce, count, dtype, static_cast<int>(op), -1);
    const std::size_t esz = element_size(dtype);
    char* bytes = static_cast<char*>(data);
    if (count * esz <= std::min(layout_.small_bytes, kAllReduceSmallBytes)) {
        return all_reduce_small(bytes, count, dtype, op);
    }
    const std::size_t per_round = layout_.chunk_bytes / esz;
    for (std::size_t done = 0; done < count; done += per_round) {
        all_reduce_round(bytes + done * esz, std::min(per_round, count - done), dtype, op);
    }
}

// Every rank reduces every rank's copy, in rank order: one step, identical results everywhere.
void Comm::all_reduce_small(char* data, std::size_t count, DType dtype, Op op) {
    const std::size_t bytes = count * element_size(dtype);
    std::memcpy(small(rank_, step_ + 1), data, bytes);
    arrive_and_wait("all_reduce");
    for (int peer = 0; peer < size_; ++peer) inputs_[peer] = small(peer, step_);
    reduce(data, nullptr, inputs_.data(), size_, count, dtype, op, size_);
}

// Reduce-scatter then all-gather: rank r stages the slices its peers reduce, reduces slice r from
// its own memory and the peers' stages into its data and its result buffer, then copies the
// other slices from their owners' result buffers.
void Comm::all_reduce_round(char* data, std::size_t count, DType dtype, Op op) {
    const std::size_t esz = element_size(dtype);
    for (int peer = 0; peer < size_; ++peer) {
        const Slice s = slice_of(count, size_, peer);
        if (peer != rank_) std::memcpy(stage(rank_) + s.lo * esz, data + s.lo * esz, s.len * esz);
    }
    arrive_and_wait("all_reduce");
    const Slice mine = slice_of(count, size_, rank_);
    for (int peer = 0; peer < size_; ++peer) {
        inputs_[peer] = (peer == rank_ ? data : stage(peer)) + mine.lo * esz;
    }
    reduce(data + mine.lo * esz, result(rank_) + mine.lo * esz, inputs_.data(), size_, mine.len, dtype, op,
           size_);
    arrive_and_wait("all_reduce");
    for (int peer = 0; peer < size_; ++peer) {
        const Slice s = slice_of(count, size_, peer);
        if (peer != rank_) std::memcpy(data + s.lo * esz, result(peer) + s.lo * esz, s.len * esz);
    }
}

// --- broadcast and all_gather --------------------------------------------------------------

void Comm::broadcast(void* data, std::size_t count, DType dtype, int root) {
    begin("broadcast", kBroadcast, count, dtype, -1, root);
    char* bytes = static_cast<char*>(data);
    const std::size_t total = count * element_size(dtype);
    if (total <= layout_.small_bytes) {
        if (rank_ == root) std::memcpy(small(rank_, step_ + 1), bytes, total);
        arrive_and_wait("broadcast");
        if (rank_ != root) std::memcpy(bytes, small(root, step_), total);
        return;
    }
    for (std::size_t done = 0; done < total; done += layout_.chunk_bytes) {
        const std::size_t len = std::min(layout_.chunk_bytes, total - done);
        if (rank_ == root) std::memcpy(stage(rank_), bytes + done, len);
        arrive_and_wait("broadcast");
        if (rank_ != root) std::memcpy(bytes + done, stage(root), len);
        arrive_and_wait("broadcast");  // the root may refill its stage
    }
}

void Comm::all_gather(void* output, const void* input, std::size_t count, DType dtype) {
    begin("all_gather_into_tensor", kAllGather, count, dtype, -1, -1);
    char* out = static_cast<char*>(output);
    const char* in = static_cast<const char*>(input);
    const std::size_t total = count * element_size(dtype);
    if (total == 0) return;
    const bool fits_small = total <= layout_.small_bytes;
    const std::size_t per_round = fits_small ? total : layout_.chunk_bytes;
    for (std::size_t done = 0; done < total; done += per_round) {
        const std::size_t len = std::min(per_round, total - done);
        char* mine = fits_small ? small(rank_, step_ + 1) : stage(rank_);
        std::memcpy(mine, in + done, len);
        arrive_and_wait("all_gather_into_tensor");
        for (int peer = 0; peer < size_; ++peer) {
            const char* source = fits_small ? small(peer, step_) : stage(peer);
            std::memmove(out + peer * total + done, peer == rank_ ? in + done : source, len);
        }
        if (!fits_small) arrive_and_wait("all_gather_into_tensor");
    }
}

// --- reduce_scatter and all_to_all ---------------------------------------------------------

void Comm::reduce_scatter(void* output, const void* input, std::size_t count, DType dtype, Op op) {
    begin("reduce_scatter_tensor", kReduceScatter, count, dtype, static_cast<int>(op), -1);
    const std::size_t esz = element_size(dtype);
    const bool fits_small = count * esz * size_ <= layout_.small_bytes;
    const std::size_t per_round = fits_small ? std::max<std::size_t>(count, 1) : layout_.chunk_bytes / (esz * size_);
    for (std::size_t done = 0; done < count; done += per_round) {
        char* staging = fits_small ? small(rank_, step_ + 1) : stage(rank_);
        reduce_scatter_round(static_cast<char*>(output) + done * esz, static_cast<const char*>(input) + done * esz,
                             count, std::min(per_round, count - done), dtype, op, staging, fits_small);
    }
}

// Stages block j of this round for every peer j at staging[j], then reduces its own block.
void Comm::reduce_scatter_round(char* out, const char* in, std::size_t stride, std::size_t count,
                                DType dtype, Op op, char* staging, bool fits_small) {
    const std::size_t esz = element_size(dtype);
    const std::size_t slot = count * esz;
    for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank_) std::memcpy(staging + peer * slot, in + peer * stride * esz, slot);
    }
    arrive_and_wait("reduce_scatter_tensor");
    for (int peer = 0; peer < size_; ++peer) {
        const char* base = fits_small ? small(peer, step_) : stage(peer);
        inputs_[peer] = peer == rank_ ? in + rank_ * stride * esz : base + rank_ * slot;
    }
    reduce(out, nullptr, inputs_.data(), size_, count, dtype, op, size_);
    if (!fits_small) arrive_and_wait("reduce_scatter_tensor");
}

void Comm::all_to_all(void* output, const void* input, std::size_t count, DType dtype) {
    begin("all_to_all_single", kAllToAll, count, dtype, -1, -1);
    char* out = static_cast<char*>(output);
    const char* in = static_cast<const char*>(input);
    const std::size_t esz = element_size(dtype);
    const std::size_t block = count * esz;
    const bool fits_small = block * size_ <= layout_.small_bytes;
    const std::size_t per_round = fits_small ? std::max<std::size_t>(block, 1) : layout_.chunk_bytes / size_;
    for (std::size_t done = 0; done < block; done += per_round) {
        const std::size_t len = std::min(per_round, block - done);
        char* staging = fits_small ? small(rank_, step_ + 1) : stage(rank_);
        for (int peer = 0; peer < size_; ++peer) {
            if (peer != rank_) std::memcpy(staging + peer * len, in + peer * block + done, len);
        }
        arrive_and_wait("all_to_all_single");
        std::memmove(out + rank_ * block + done, in + rank_ * block + done, len);
        for (int peer = 0; peer < size_; ++peer) {
            const char* base = fits_small ? small(peer, step_) : stage(peer);
            if (peer != rank_) std::memcpy(out + peer * block + done, base + rank_ * len, len);
        }
        if (!fits_small) arrive_and_wait("all_to_all_single");
    }
}

}  // namespace commlayer::shm
