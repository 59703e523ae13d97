// Calling an MPI collective's C function without MPI's headers (csrc/mpi/fast_paths.cpp).
//
// The library is the one mpi4py loaded, known only at run time, and the MPIs differ in ABI:
// MPICH and Intel MPI spell a handle (MPI_Comm, MPI_Datatype, MPI_Op) as an int, Open MPI as a
// pointer. The caller passes the function's address, the handles as mpi4py holds them (widened
// to 64 bits) and which of the two spellings the library uses; the call is then made through a
// function pointer of exactly the library's signature, so no argument is reinterpreted.
#pragma once

#include <Python.h>

#include <cstdint>

namespace commlayer::mpi {

enum class Kind { all_reduce, broadcast, all_gather, reduce_scatter, all_to_all };

// The handles of one plan, as the library's C ABI spells them (widened to 64 bits).
struct Handles {
    std::uintptr_t comm = 0, datatype = 0, reduction = 0, in_place = 0;
    bool int_handles = false;  // MPICH's ABI (MPI_Comm is an int); else pointers (Open MPI)
};

// One planned kind of call: which collective, its C function, its handles and root.
struct MpiCall {
    Kind kind = Kind::all_reduce;
    void* function = nullptr;
    Handles handles;
    int root = 0;
};

template <class H>
H as_handle(std::uintptr_t value) {
    if constexpr (sizeof(H) == sizeof(int)) {
        return static_cast<H>(static_cast<std::uint32_t>(value));
    } else {
        return reinterpret_cast<H>(value);
    }
}

// One blocking call with handles of type H (int or void*); MPI's error code. ``count`` is the
// element count MPI takes: all_gather's and all_to_all's per rank, reduce_scatter's result.
template <class H>
int call_mpi(const MpiCall& call, void* output, const void* input, int count) {
    const Handles& handles = call.handles;
    const H comm = as_handle<H>(handles.comm), type = as_handle<H>(handles.datatype);
    const H reduction = as_handle<H>(handles.reduction);
    switch (call.kind) {
        case Kind::all_reduce:
            return reinterpret_cast<int (*)(const void*, void*, int, H, H, H)>(call.function)(
                reinterpret_cast<const void*>(handles.in_place), output, count, type, reduction, comm);
        case Kind::broadcast:
            return reinterpret_cast<int (*)(void*, int, H, int, H)>(call.function)(output, count, type, call.root, comm);
        case Kind::all_gather:
        case Kind::all_to_all:
            return reinterpret_cast<int (*)(const void*, int, H, void*, int, H, H)>(call.function)(
                input, count, type, output, count, type, comm);
        case Kind::reduce_scatter:
            return reinterpret_cast<int (*)(const void*, void*, int, H, H, H)>(call.function)(input, output, count, type,
                                                                                          reduction, comm);
    }
    return -1;
}

// The blocking call with the GIL released (peers' Python threads and the watchdog run meanwhile).
inline int call_without_gil(const MpiCall& call, void* output, const void* input, int count) {
    int code = 0;
    Py_BEGIN_ALLOW_THREADS;
    code = call.handles.int_handles ? call_mpi<int>(call, output, input, count)
                                    : call_mpi<void*>(call, output, input, count);
    Py_END_ALLOW_THREADS;
    return code;
}

}  // namespace commlayer::mpi
