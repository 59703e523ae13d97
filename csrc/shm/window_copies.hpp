// A window's blocking put and get as plain CPython functions f(tensor, rank, offset) -> bool.
//
// The user layer's checks of a put (a contiguous CPU tensor of the window's dtype, a member rank,
// an int offset whose span fits) cost more than the copy itself up to tens of KiB when asked of
// the tensor's Python attributes. Here they are field reads of the tensor's metadata (the
// reader of commlayer.core._tensor_meta). A call whose arguments are not plainly valid does
// nothing and returns False: the user layer then runs the checks that explain what is wrong.
#pragma once

#include <Python.h>

#include <cstdint>
#include <vector>

#include "../common/tensor_meta.h"

namespace commlayer::shm {

struct WindowCopySpec {
    std::vector<std::uintptr_t> addresses;  // every group rank's window memory, in group order
    std::vector<long long> sizes;           // and its element count
    PyObject* group_ranks;                  // dict: global rank -> group rank (a new reference)
    int scalar_type;                        // the window's c10::ScalarType
    int itemsize;
    CommlayerTensorMetaReader read;
};

// A new reference to the tuple (put, get); nullptr with an exception set.
PyObject* make_window_copies(const WindowCopySpec& spec);

// One put's or get's copy (copy_bytes), called with the GIL held; a long one lets other Python
// threads run meanwhile.
void window_copy_bytes(void* dst, const void* src, std::size_t bytes);

}  // namespace commlayer::shm
