// Raw oneCCL allreduce benchmark: the reference commlayer's ccl backend is measured against.
//
// Plain oneCCL C++ API, no Python: what a hand-written oneCCL program gets on this machine.
// It times exactly what `commlayer bench --ops all_reduce` times: in-place float32 SUM,
// `warmup` untimed ops, a barrier, then `iters` ops each waited for; a rank's figure is its
// mean time per op and the reported figure is the slowest rank's (nccl-tests convention).
// After the timed loop, one more op on fresh values is checked exactly.
//
// Bootstrap without MPI: rank 0 creates oneCCL's main KVS and writes its address to a file
// (atomically, via rename); the other ranks poll for the file. Ranks come from RANK and
// WORLD_SIZE (torchrun / commlayer's launcher) unless given on the command line.
//
//   ccl_allreduce_bench --kvs-file /tmp/kvs.addr [--min-bytes 8] [--max-bytes 67108864]
//                       [--factor 4] [--iters 20] [--warmup 5] [--timeout 60]
//                       [--wait native|poll]
//
// Output (rank 0, one JSON object per line):
//   {"backend": "oneccl-raw", "op": "all_reduce", "bytes": 1048576, "world_size": 2,
//    "time_us": 812.4, "wrong": 0}
#include <oneapi/ccl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
    int rank = -1;
    int size = -1;
    std::string kvs_file;
    size_t min_bytes = 8;
    size_t max_bytes = size_t{64} << 20;
    size_t factor = 4;
    int iters = 20;
    int warmup = 5;
    double timeout_s = 60.0;
    bool poll = false;  // --wait poll: test() + yield, the binding's discipline; native: event.wait()
};

int env_int(const char* name) {
    const char* value = std::getenv(name);
    return value ? std::atoi(value) : -1;
}

Options parse(int argc, char** argv) {
    Options options;
    options.rank = env_int("RANK");
    options.size = env_int("WORLD_SIZE");
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const std::string value = argv[i + 1];
        if (flag == "--rank") options.rank = std::stoi(value);
        else if (flag == "--size") options.size = std::stoi(value);
        else if (flag == "--kvs-file") options.kvs_file = value;
        else if (flag == "--min-bytes") options.min_bytes = std::stoull(value);
        else if (flag == "--max-bytes") options.max_bytes = std::stoull(value);
        else if (flag == "--factor") options.factor = std::stoull(value);
        else if (flag == "--iters") options.iters = std::stoi(value);
        else if (flag == "--warmup") options.warmup = std::stoi(value);
        else if (flag == "--timeout") options.timeout_s = std::stod(value);
        else if (flag == "--wait") options.poll = value == "poll";
        else throw std::invalid_argument("unknown option " + flag);
    }
    if (options.rank < 0 || options.size <= 0 || options.rank >= options.size) {
        throw std::invalid_argument("need 0 <= rank < size (RANK/WORLD_SIZE or --rank/--size)");
    }
    if (options.kvs_file.empty() || options.factor < 2 || options.iters <= 0) {
        throw std::invalid_argument("need --kvs-file, --factor >= 2 and --iters > 0");
    }
    return options;
}

void publish_address(const ccl::kvs::address_type& address, const std::string& path) {
    const std::string partial = path + ".partial";
    std::ofstream(partial, std::ios::binary).write(address.data(), address.size());
    if (std::rename(partial.c_str(), path.c_str()) != 0) {
        throw std::runtime_error("cannot publish the KVS address at " + path);
    }
}

ccl::kvs::address_type read_address(const std::string& path, double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    ccl::kvs::address_type address{};
    while (true) {
        std::ifstream file(path, std::ios::binary);
        if (file && file.read(address.data(), address.size())) {
            return address;
        }
        if (std::chrono::steady_clock::now() > deadline) {
            throw std::runtime_error("rank 0 did not publish its KVS address at " + path);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

ccl::shared_ptr_class<ccl::kvs> connect(const Options& options) {
    if (options.rank == 0) {
        auto kvs = ccl::create_main_kvs();
        publish_address(kvs->get_address(), options.kvs_file);
        return kvs;
    }
    return ccl::create_kvs(read_address(options.kvs_file, options.timeout_s));
}

// Rank r's element i: small integers, so every sum over ranks is exact in float32.
void fill(std::vector<float>& buffer, int rank) {
    for (size_t i = 0; i < buffer.size(); ++i) {
        buffer[i] = static_cast<float>(1 + rank + static_cast<int>(i % 1000));
    }
}

long count_wrong(const std::vector<float>& buffer, int size) {
    long wrong = 0;
    for (size_t i = 0; i < buffer.size(); ++i) {
        const float base = static_cast<float>(i % 1000);
        const float expected = size * (1 + base) + static_cast<float>(size * (size - 1) / 2);
        wrong += buffer[i] != expected;
    }
    return wrong;
}

// What commlayer's binding does instead of ccl::event::wait (see Event::wait_for there):
// spin on test() briefly, then yield the core between polls.
void poll_until_done(ccl::event& event) {
    for (unsigned polls = 0; !event.test(); ++polls) {
        if (polls >= 64) std::this_thread::yield();
    }
}

double slowest(double mine, const ccl::communicator& comm) {
    double result = 0.0;
    ccl::allreduce(&mine, &result, 1, ccl::datatype::float64, ccl::reduction::max, comm).wait();
    return result;
}

void measure(size_t bytes, const Options& options, const ccl::communicator& comm) {
    const size_t count = std::max<size_t>(1, bytes / sizeof(float));
    std::vector<float> buffer(count);
    fill(buffer, options.rank);
    const auto allreduce = [&] {
        auto event = ccl::allreduce(buffer.data(), buffer.data(), count, ccl::reduction::sum, comm);
        options.poll ? poll_until_done(event) : event.wait();
    };
    for (int i = 0; i < options.warmup; ++i) allreduce();
    ccl::barrier(comm).wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iters; ++i) allreduce();
    const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    const double time_us = slowest(elapsed.count() / options.iters, comm);

    fill(buffer, options.rank);
    allreduce();
    long wrong = count_wrong(buffer, options.size);
    ccl::allreduce(&wrong, &wrong, 1, ccl::reduction::sum, comm).wait();
    if (options.rank == 0) {
        std::printf("{\"backend\": \"oneccl-raw\", \"op\": \"all_reduce\", \"bytes\": %zu, "
                    "\"world_size\": %d, \"time_us\": %.3f, \"wrong\": %ld}\n",
                    count * sizeof(float), options.size, time_us, wrong);
        std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options options = parse(argc, argv);
        auto kvs = connect(options);
        auto comm = ccl::create_communicator(options.size, options.rank, kvs);
        for (size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.factor) {
            measure(bytes, options, comm);
        }
        ccl::barrier(comm).wait();
    } catch (const std::exception& error) {
        std::fprintf(stderr, "ccl_allreduce_bench: %s\n", error.what());
        return 1;
    }
    return 0;
}
