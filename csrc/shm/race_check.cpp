// Race check of the shm communicator: every "rank" is a thread of this process, all sharing one
// block of memory, so ThreadSanitizer sees every cross-rank access (in a real job the ranks are
// processes, which no race detector can watch together).
//
//   g++ -std=c++17 -O1 -g -fsanitize=thread -pthread race_check.cpp comm.cpp kernels.cpp placement.cpp -o race_check
//   ./race_check RANKS OPS        # exit 0 and "race_check: N ops on R ranks: all results exact"
//
// Each thread runs the same pseudo-random sequence of ops (all sizes, both paths, tiny buffers so
// the bandwidth path runs many rounds) and checks every result exactly.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm.hpp"

using namespace commlayer::shm;

namespace {

constexpr std::size_t kSmall = 256;
constexpr std::size_t kChunk = 4096;

// Rank r's element i: small integers, so float sums are exact in any order.
float value(int rank, std::size_t i, int op_index) { return float((rank * 7 + i * 3 + op_index) % 100); }

void expect(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("race_check: wrong result: " + what);
}

void run_rank(Comm& comm, int ops, std::vector<std::string>& failures) {
    const int rank = comm.rank(), size = comm.size();
    std::mt19937 shared(42);  // same draws on every rank: same ops in the same order
    try {
        for (int k = 0; k < ops; ++k) {
            const int kind = int(shared() % 6);
            const std::size_t count = std::size_t(1 + shared() % 3000);
            const int root = int(shared() % size);
            std::vector<float> in(count * size), out(count * size, -1.0f);
            for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i, k);
            const std::string label = "op " + std::to_string(k) + " kind " + std::to_string(kind);
            if (kind == 0) {
                comm.all_reduce(in.data(), count, DType::f32, Op::sum);
                for (std::size_t i = 0; i < count; ++i) {
                    float sum = 0;
                    for (int r = 0; r < size; ++r) sum += value(r, i, k);
                    expect(in[i] == sum, label);
                }
            } else if (kind == 1) {
                comm.broadcast(in.data(), count, DType::f32, root);
                for (std::size_t i = 0; i < count; ++i) expect(in[i] == value(root, i, k), label);
            } else if (kind == 2) {
                comm.all_gather(out.data(), in.data(), count, DType::f32);
                for (int r = 0; r < size; ++r)
                    for (std::size_t i = 0; i < count; ++i) expect(out[r * count + i] == value(r, i, k), label);
            } else if (kind == 3) {
                comm.reduce_scatter(out.data(), in.data(), count, DType::f32, Op::max);
                for (std::size_t i = 0; i < count; ++i) {
                    float best = 0;
                    for (int r = 0; r < size; ++r) best = std::max(best, value(r, rank * count + i, k));
                    expect(out[i] == best, label);
                }
            } else if (kind == 4) {
                comm.all_to_all(out.data(), in.data(), count, DType::f32);
                for (int r = 0; r < size; ++r)
                    for (std::size_t i = 0; i < count; ++i)
                        expect(out[r * count + i] == value(r, rank * count + i, k), label);
            } else {
                comm.barrier();
            }
        }
    } catch (const std::exception& error) {
        failures[rank] = error.what();
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int size = argc > 1 ? std::atoi(argv[1]) : 3;
    const int ops = argc > 2 ? std::atoi(argv[2]) : 300;
    const Layout layout{kSmall, kChunk};
    std::vector<char> memory(layout.region_bytes() * size + 64, 0);
    char* base = memory.data() + (64 - reinterpret_cast<std::uintptr_t>(memory.data()) % 64) % 64;
    std::vector<char*> regions;
    for (int r = 0; r < size; ++r) regions.push_back(base + layout.region_bytes() * r);
    std::vector<Comm> comms;
    comms.reserve(size);
    std::vector<int> ranks(size);
    for (int r = 0; r < size; ++r) ranks[r] = r;
    for (int r = 0; r < size; ++r) {
        comms.emplace_back("race-check", ranks, r, size, regions, std::vector<pid_t>(size, 0), layout,
                           WaitPolicy{60.0, 64});
    }
    std::vector<std::string> failures(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) threads.emplace_back(run_rank, std::ref(comms[r]), ops, std::ref(failures));
    for (auto& thread : threads) thread.join();
    for (int r = 0; r < size; ++r) {
        if (!failures[r].empty()) {
            std::fprintf(stderr, "rank %d: %s\n", r, failures[r].c_str());
            return 1;
        }
    }
    std::printf("race_check: %d ops on %d ranks: all results exact\n", ops, size);
    return 0;
}
