// The window fast paths of the shm backend; see window_copies.hpp.
#include "window_copies.hpp"

#include "../common/recording.hpp"
#include "copy.hpp"

namespace commlayer::shm {

namespace {

constexpr const char* kCapsuleName = "commlayer.shm.window_copies";
// From this many bytes a copy runs long enough that releasing the GIL for it pays.
constexpr std::size_t kLongCopyBytes = std::size_t{1} << 20;
constexpr int kCpu = 0;      // c10::DeviceType::CPU
constexpr int kStrided = 0;  // c10::Layout::Strided

enum class Direction { put, get };

// Where one plainly valid call copies between.
struct Span {
    void* local = nullptr;
    void* remote = nullptr;
    std::size_t bytes = 0;
};

// 1 with `span` filled in, 0 for arguments that are not plainly valid (no exception set), -1
// with an exception set.
int plain_span(const WindowCopySpec& spec, PyObject* const* args, Span& span) {
    CommlayerTensorMeta meta;
    if (!spec.read(args[0], &meta) || meta.scalar_type != spec.scalar_type || meta.device_type != kCpu ||
        meta.layout != kStrided || !meta.contiguous || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])) {
        return 0;
    }
    PyObject* peer = PyDict_GetItemWithError(spec.group_ranks, args[1]);  // borrowed
    if (peer == nullptr) return PyErr_Occurred() ? -1 : 0;
    const long long offset = PyLong_AsLongLong(args[2]);
    if (offset == -1 && PyErr_Occurred()) {  // an int beyond 64 bits: the checks explain it
        PyErr_Clear();
        return 0;
    }
    const std::size_t index = PyLong_AsSize_t(peer);
    const long long count = commlayer_tensor_meta_numel(&meta);
    if (offset < 0 || offset > spec.sizes[index] - count) return 0;
    unsigned long long address = 0;
    if (!common::call_for_integer(args[0], common::names().data_ptr, address)) return -1;
    span.local = reinterpret_cast<void*>(static_cast<std::uintptr_t>(address));
    span.remote = reinterpret_cast<void*>(spec.addresses[index] + static_cast<std::uintptr_t>(offset) * spec.itemsize);
    span.bytes = static_cast<std::size_t>(count) * spec.itemsize;
    return 1;
}

template <Direction direction>
PyObject* run(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "window copy: expected (tensor, rank, offset), received %zd arguments", nargs);
        return nullptr;
    }
    const auto* spec = static_cast<const WindowCopySpec*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (spec == nullptr) return nullptr;
    Span span;
    const int plain = plain_span(*spec, args, span);
    if (plain <= 0) return plain < 0 ? nullptr : Py_NewRef(Py_False);
    if (direction == Direction::put) {
        window_copy_bytes(span.remote, span.local, span.bytes);
    } else {
        window_copy_bytes(span.local, span.remote, span.bytes);
    }
    Py_RETURN_TRUE;
}

PyMethodDef put_def = {"shm_window_put", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run<Direction::put>)),
                       METH_FASTCALL, "put(tensor, dst, offset) -> bool: the copy, if the arguments are plainly valid"};
PyMethodDef get_def = {"shm_window_get", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run<Direction::get>)),
                       METH_FASTCALL, "get(tensor, src, offset) -> bool: the copy, if the arguments are plainly valid"};

void destroy(PyObject* capsule) {
    auto* spec = static_cast<WindowCopySpec*>(PyCapsule_GetPointer(capsule, kCapsuleName));
    if (spec == nullptr) return;
    Py_XDECREF(spec->group_ranks);
    delete spec;
}

}  // namespace

void window_copy_bytes(void* dst, const void* src, std::size_t bytes) {
    if (bytes < kLongCopyBytes) {
        copy_bytes(dst, src, bytes);
        return;
    }
    Py_BEGIN_ALLOW_THREADS copy_bytes(dst, src, bytes);
    Py_END_ALLOW_THREADS
}

PyObject* make_window_copies(const WindowCopySpec& spec) {
    auto* owned = new WindowCopySpec(spec);
    Py_INCREF(owned->group_ranks);
    PyObject* capsule = PyCapsule_New(owned, kCapsuleName, destroy);
    if (capsule == nullptr) {
        Py_DECREF(owned->group_ranks);
        delete owned;
        return nullptr;
    }
    PyObject* put = PyCFunction_NewEx(&put_def, capsule, nullptr);
    PyObject* get = put == nullptr ? nullptr : PyCFunction_NewEx(&get_def, capsule, nullptr);
    Py_DECREF(capsule);  // the functions hold it
    if (get == nullptr) {
        Py_XDECREF(put);
        return nullptr;
    }
    PyObject* pair = PyTuple_Pack(2, put, get);
    Py_DECREF(put);
    Py_DECREF(get);
    return pair;
}

}  // namespace commlayer::shm
