// shm's fast paths: one C function per planned kind of call, ``run(async_op, *tensors)``.
//
// The facade calls a backend's plan for every small op (see commlayer.facade.calls.dispatch), so its
// cost is the op's cost at 8 bytes. A pybind11 method plus the Python closure around it spent
// ~0.4 us per call before the communicator ran (~0.1 us for 2 ranks); this plain CPython
// function (METH_FASTCALL, bound to a capsule) reads the tensor's address, element count and
// dtype itself and calls the communicator directly.
#pragma once

#include <Python.h>

#include "../common/recording.hpp"
#include "comm.hpp"

namespace commlayer::shm {

enum class OpKind { all_reduce, broadcast, all_gather, reduce_scatter };

// The Python exception types the communicator's errors become (set once by the module).
struct FastPathErrors {
    PyObject* timeout = nullptr;
    PyObject* peer = nullptr;
    PyObject* mismatch = nullptr;
};

using common::RecordingSpec;

struct FastPathSpec {
    PyObject* owner;        // the Python object that owns `comm` (kept alive by the fast path)
    Comm* comm;
    OpKind kind;
    int fixed;              // the reduce op code (all_reduce, reduce_scatter) or the root (broadcast)
    PyObject* dtype_codes;  // dict: torch.dtype -> DType code
    int dtype = -1;         // the plan's DType code, when its key fixes the dtype; -1: read each tensor's
    PyObject* completed;    // called with (output,) to make an async op's (completed) Work
    RecordingSpec recording;  // owned: the fast path releases it
};

// A new reference to ``run(async_op, tensor)`` (all_reduce, broadcast) or
// ``run(async_op, output, tensor)`` (all_gather, reduce_scatter); nullptr with an exception set.
// It takes over spec.recording's references, also when it fails.
PyObject* make_fast_path(const FastPathSpec& spec, const FastPathErrors& errors);

}  // namespace commlayer::shm
