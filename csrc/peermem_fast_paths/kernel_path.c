// peermem's fast path for the ops its kernels serve, in C: commlayer.backends.peermem._fast_paths.
//
// The Python twin, and the reference this must behave exactly like, is the `run` of
// PeermemBackend.recorded_plan: per call, the kernels or NCCL's fast path. Here a call the kernels
// serve through the staging region (a route with no registered segments) is launched with no
// Python frame: read the tensors (the C tensor reader), look the route up in a table keyed by
// bytes and dtype, read the current stream, enter the call in the flight recorder, call the kernel
// library's pm_launch through its address and, for a blocking call, check the group's failure
// flag. Two kinds of call make one Python call each: a zero-copy route (whose tensors peers reach
// where they lie) asks the group's segment registry for the tensors' places, and a call on another
// stream than the group's last kernel has the group's StreamOrder join the two. A call of the sizes
// NCCL serves goes straight to NCCL's fast path. Every other call, rare by construction, goes to
// the twin: large asynchronous calls from the device's default stream (they move to the group's
// stream), tensors the reader cannot read, and splits that are not lists or tuples of ints.
//
// all_to_all_single, on a group whose kernel serves it, takes the same path: its splits become the
// kernel's byte table here (pm_all_to_all), and its tensors are always placed, since the kernel
// reads each peer's input where it lies.
//
// Only the Python C API is used: the kernel library is loaded at run time (ctypes), and its launch
// functions reach this file as addresses.
#include "peermem_fast_paths.h"

#include "../common/python_module.h"
#include "../common/recorder.h"

#include <string.h>

// pm_launch in csrc/peermem/kernels.cu: (comm, code, in, out, bytes, blocks, stream, in_slot,
// out_slot, in_off, out_off, descriptor) -> 0 or an error code.
typedef int (*KernelStart)(void *, int, const void *, void *, unsigned long long, int, void *, int, int,
                              unsigned long long, unsigned long long, int);
// pm_all_to_all: (comm, in, out, in_bytes, splits, blocks, stream, in_slot, in_off, descriptor,
// push_limit) -> 0 or an error code.
typedef int (*ExchangeStart)(void *, const void *, void *, unsigned long long, const unsigned long long *, int,
                             void *, int, unsigned long long, int, unsigned long long);

enum Op { ALL_REDUCE = 0, ALL_GATHER = 1, REDUCE_SCATTER = 2, ALL_TO_ALL = 3 };
// The all_to_all kernel's split table: send offsets, send lengths, receive offsets, receive
// lengths, in bytes, MAX_RANKS each (backends/peermem/splits.py).
#define MAX_RANKS 8
#define SPLIT_TABLE (4 * MAX_RANKS)
enum Verdict { FAILED = -1, KERNEL = 0, NCCL = 1, TWIN = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int op, device_type, device, world;  // the device (c10's type and index) the kernels serve
    long long async_bytes;  // asynchronous calls of at least this many bytes from the default stream
                            // go to the twin (< 0: none)
    uintptr_t default_stream;  // the device's default stream (raw handle)
    KernelStart launch;      // all_reduce, all_gather and reduce_scatter's
    ExchangeStart exchange;  // all_to_all_single's
    unsigned long long push_bytes;  // all_to_all_single: the largest chunk pushed before the barrier
    void *handle;
    const volatile int *failed;  // the group's flag, set by a kernel that timed out
    PyObject *comm;              // its handle is None once the group's region is freed
    // bytes << 8 | scalar type -> (code, blocks[, placed]) or None (NCCL); anything else: the twin.
    // all_to_all_single's is always (0, blocks, True), the group's one choice. The group's own
    // table when given, so that it can empty it when its routing changes (PeerComm.force).
    PyObject *routes;
    PyObject *places;  // places(source, output) -> (in_slot, out_slot, in_off, out_off, descriptor)
    PyObject *route_of, *order, *raw_stream, *device_number, *nccl, *twin, *started_work, *launch_failed,
        *raise_failed;
    CommlayerRecording recording;
    PyObject *last_shape;  // the tuple of sizes the last entry holds
} KernelPath;

// Where a call's tensors are for its peers: registered segments, or (slots -1) the staging region.
typedef struct {
    int in_slot, out_slot, descriptor;
    unsigned long long in_off, out_off;
} Places;

// A staged call's places: the staging region on both sides.
static const Places UNPLACED = {.in_slot = -1, .out_slot = -1, .descriptor = -1, .in_off = 0, .out_off = 0};

// One call as the kernel takes it, and the tensor its flight-recorder entry describes.
typedef struct {
    int code, blocks;
    int placed;    // a zero-copy route, whose places the registry gives
    int switched;  // on another stream than the group's last kernel: StreamOrder joins them
    uintptr_t source, output, stream;
    unsigned long long bytes;
    Places places;
    CommlayerTensorMeta described;
    unsigned long long splits[SPLIT_TABLE];  // all_to_all_single's
} KernelCall;

static int readable(const CommlayerTensorMeta *meta, const KernelPath *self) {
    return meta->device_type == self->device_type && meta->device_index == self->device && meta->contiguous &&
           meta->data != 0 && meta->data % 16 == 0;
}

// Whether the group's region is still mapped: a plan may outlive its group, whose calls then go
// where the twin sends them (the backend's methods, which know the group is gone).
static int attached(KernelPath *self) {
    PyObject *handle = PyObject_GetAttr(self->comm, str_handle);
    int mapped = handle != NULL && handle != Py_None;
    if (handle == NULL) PyErr_Clear();
    Py_XDECREF(handle);
    return mapped;
}

// The route of a call of `nbytes` of `routed`'s dtype: looked up, else asked of route_of once.
static PyObject *route_for(KernelPath *self, PyObject *routed, long long nbytes, int scalar_type) {
    PyObject *key = PyLong_FromLongLong(nbytes << 8 | scalar_type);
    if (key == NULL) return NULL;
    PyObject *route = PyDict_GetItemWithError(self->routes, key);  // borrowed
    if (route == NULL && !PyErr_Occurred()) {
        route = PyObject_CallOneArg(self->route_of, routed);
        if (route != NULL && PyDict_SetItem(self->routes, key, route) < 0) Py_CLEAR(route);
        Py_XDECREF(route);  // the table keeps it
    }
    Py_DECREF(key);
    return route;
}

// Whether the current stream is the one the group's last kernel went to (else the twin joins them).
static int on_last_stream(KernelPath *self, uintptr_t *stream) {
    PyObject *current = PyObject_CallOneArg(self->raw_stream, self->device_number);
    if (current == NULL) return -1;
    PyObject *last = PyObject_GetAttr(self->order, str_last);
    int same = last != NULL && PyObject_RichCompareBool(current, last, Py_EQ);
    *stream = (uintptr_t)PyLong_AsVoidPtr(current);
    Py_DECREF(current);
    Py_XDECREF(last);
    return PyErr_Occurred() ? -1 : same;
}

// A zero-copy call's places, as the group's segment registry gives them (0 with the error set).
static int place_tensors(KernelPath *self, PyObject *source, PyObject *output, Places *places) {
    PyObject *found = PyObject_CallFunctionObjArgs(self->places, source, output, NULL);
    if (found == NULL) return 0;
    int ok = PyArg_ParseTuple(found, "iiKKi;peermem places: (in_slot, out_slot, in_off, out_off, descriptor) "
                              "expected", &places->in_slot, &places->out_slot, &places->in_off, &places->out_off,
                              &places->descriptor);
    Py_DECREF(found);
    return ok;
}

// Reads the call's tensors into first and second (all_reduce's one tensor into both; a paired op's
// two, of one dtype); 0 where the twin must serve.
static int read_tensors(const KernelPath *self, PyObject *const *tensors, CommlayerTensorMeta *first,
                        CommlayerTensorMeta *second) {
    if (!tensor_meta_reader(tensors[0], first) || !readable(first, self)) return 0;
    if (self->op == ALL_REDUCE) {
        *second = *first;
        return 1;
    }
    return tensor_meta_reader(tensors[1], second) && readable(second, self) &&
           second->scalar_type == first->scalar_type;
}

static long long tensor_bytes(const CommlayerTensorMeta *meta) {
    return commlayer_tensor_meta_numel(meta) * meta->itemsize;
}

// One side of all_to_all_single's byte table: where each peer's chunk of `meta`'s tensor starts
// and how long it is, from `splits` (rows of dim 0 per peer, or None: equal chunks). 1 when
// filled, 0 where splits are not `world` non-negative ints (the twin says what is wrong), -1 with
// the error set.
static int split_side(PyObject *splits, const CommlayerTensorMeta *meta, int world, unsigned long long *offsets,
                      unsigned long long *lengths) {
    unsigned long long nbytes = (unsigned long long)tensor_bytes(meta), offset = 0;
    unsigned long long row = meta->dim > 0 && meta->sizes[0] > 0 ? nbytes / (unsigned long long)meta->sizes[0] : 0;
    int listed = splits != Py_None;
    if (listed && !((PyList_CheckExact(splits) || PyTuple_CheckExact(splits)) &&
                    PySequence_Fast_GET_SIZE(splits) == world)) {
        return 0;
    }
    for (int peer = 0; peer < world; peer++) {
        unsigned long long length = nbytes / (unsigned long long)world;
        if (listed) {
            PyObject *rows = PySequence_Fast_GET_ITEM(splits, peer);
            long long count = PyLong_CheckExact(rows) ? PyLong_AsLongLong(rows) : -1;
            if (count < 0) return PyErr_Occurred() ? -1 : 0;
            length = (unsigned long long)count * row;
        }
        offsets[peer] = offset;
        lengths[peer] = length;
        offset += length;
    }
    return 1;
}

// all_to_all_single's byte table (see split_side): sends from the input (args[1], input_splits in
// args[3]), receives into the output (args[0], output_splits in args[2]).
static int exchange_table(const KernelPath *self, PyObject *const *args, const CommlayerTensorMeta *output,
                          const CommlayerTensorMeta *input, KernelCall *call) {
    unsigned long long *table = call->splits;
    memset(table, 0, sizeof(call->splits));
    int sends = split_side(args[3], input, self->world, table, table + MAX_RANKS);
    if (sends != 1) return sends;
    return split_side(args[2], output, self->world, table + 2 * MAX_RANKS, table + 3 * MAX_RANKS);
}

// How the call runs: the kernel (with *call filled in), NCCL's fast path, or the twin.
static enum Verdict plan_call(KernelPath *self, PyObject *const *args, int async_op, KernelCall *call) {
    CommlayerTensorMeta first, second;
    if (tensor_meta_reader == NULL || !attached(self) || !read_tensors(self, args, &first, &second)) return TWIN;
    int routed_at = self->op == REDUCE_SCATTER || self->op == ALL_TO_ALL;  // the input routes these
    const CommlayerTensorMeta *routed = routed_at ? &second : &first;
    long long nbytes = tensor_bytes(routed);
    PyObject *route = route_for(self, args[routed_at], nbytes, routed->scalar_type);
    if (route == NULL) return FAILED;
    if (route == Py_None) return NCCL;
    Py_ssize_t items = PyTuple_Check(route) ? PyTuple_GET_SIZE(route) : 0;
    if (items != 2 && items != 3) return TWIN;
    if (self->op == ALL_TO_ALL) {
        int table = exchange_table(self, args, &first, &second, call);
        if (table != 1) return table < 0 ? FAILED : TWIN;
    }
    int same = on_last_stream(self, &call->stream);
    if (same < 0) return FAILED;
    if (async_op && self->async_bytes >= 0 && call->stream == self->default_stream) {
        long long first_bytes = tensor_bytes(&first), second_bytes = tensor_bytes(&second);
        long long largest = first_bytes > second_bytes ? first_bytes : second_bytes;
        if (largest >= self->async_bytes) return TWIN;  // it moves to the group's stream (PeerComm._stream_for)
    }
    call->switched = !same;
    call->placed = items == 3;
    call->places = UNPLACED;
    call->code = (int)PyLong_AsLong(PyTuple_GET_ITEM(route, 0));
    call->blocks = (int)PyLong_AsLong(PyTuple_GET_ITEM(route, 1));
    call->output = first.data;  // all_reduce's one tensor, or the output of the others
    call->source = second.data;
    int shared = self->op == ALL_GATHER || self->op == REDUCE_SCATTER;  // the kernel takes a rank's share
    call->bytes = (unsigned long long)(shared ? nbytes / self->world : nbytes);
    call->described = *routed;
    return PyErr_Occurred() ? FAILED : KERNEL;
}

// Calls `raising(argument)`, which raises the group's error; NULL with it set.
static PyObject *raise_from(PyObject *raising, PyObject *argument) {
    PyObject *returned = argument == NULL ? PyObject_CallNoArgs(raising) : PyObject_CallOneArg(raising, argument);
    if (returned != NULL) {
        Py_DECREF(returned);
        PyErr_SetString(PyExc_RuntimeError, "peermem: the kernel launch failed without an error");
    }
    return NULL;
}

// Orders the current stream after the group's last kernel (StreamOrder.stream, which also knows
// what a graph capture allows) and reads its handle again; 0 with the error set.
static int join_streams(KernelPath *self, uintptr_t *stream) {
    PyObject *joined = PyObject_CallMethodNoArgs(self->order, str_stream);
    if (joined == NULL) return 0;
    *stream = (uintptr_t)PyLong_AsVoidPtr(joined);
    Py_DECREF(joined);
    return !PyErr_Occurred();
}

// pm_launch's codes are CUDA's (> 0) and the library's own (< 0, above this one).
#define PREPARING_FAILED (-100000)

// Joins the streams and places the tensors where the call needs it, then launches its kernel:
// pm_launch's code, or PREPARING_FAILED with the Python error set.
static int launch_call(KernelPath *self, PyObject *const *tensors, KernelCall *call) {
    if (call->switched && !join_streams(self, &call->stream)) return PREPARING_FAILED;
    PyObject *source = tensors[self->op == ALL_REDUCE ? 0 : 1];
    if (call->placed && !place_tensors(self, source, tensors[0], &call->places)) return PREPARING_FAILED;
    const Places *at = &call->places;
    if (self->op == ALL_TO_ALL) {
        return self->exchange(self->handle, (const void *)call->source, (void *)call->output, call->bytes,
                              call->splits, call->blocks, (void *)call->stream, at->in_slot, at->in_off,
                              at->descriptor, self->push_bytes);
    }
    return self->launch(self->handle, call->code, (const void *)call->source, (void *)call->output, call->bytes,
                        call->blocks, (void *)call->stream, at->in_slot, at->out_slot, at->in_off, at->out_off,
                        at->descriptor);
}

// The launch itself, entered in the flight recorder: the async call's Work, or None once the
// blocking call is checked.
static PyObject *run_kernel(KernelPath *self, PyObject *const *tensors, int async_op, KernelCall *call) {
    PyObject *shape = commlayer_tensor_meta_shape(&self->last_shape, &call->described);
    PyObject *entry = shape == NULL ? NULL : commlayer_recorder_enter(&self->recording, shape);
    if (entry == NULL) return NULL;
    int rc = launch_call(self, tensors, call);
    PyObject *result = NULL;
    if (rc == PREPARING_FAILED) {
        // the Python error stands
    } else if (rc != 0) {
        PyObject *code = PyLong_FromLong(rc);
        if (code != NULL) raise_from(self->launch_failed, code);
        Py_XDECREF(code);
    } else if (async_op) {
        result = PyObject_CallOneArg(self->started_work, tensors[0]);
        if (result != NULL && commlayer_recorder_track(entry, result) < 0) Py_CLEAR(result);
    } else if (*self->failed) {
        raise_from(self->raise_failed, NULL);
    } else if (commlayer_recorder_complete(&self->recording, entry) == 0) {
        result = Py_NewRef(Py_None);
    }
    if (result == NULL) result = commlayer_recorder_fail(&self->recording);
    Py_DECREF(entry);
    return result;
}

// What each op's run takes after async_op, and how many arguments that is.
static const char *const SIGNATURES[] = {"tensor", "output, input", "output, input",
                                         "output, input, output_splits, input_splits"};
static const Py_ssize_t ARGUMENTS[] = {1, 2, 2, 4};

// run(async_op, tensor) for all_reduce, run(async_op, output, input) for all_gather and
// reduce_scatter, run(async_op, output, input, output_splits, input_splits) for all_to_all_single.
static PyObject *kernel_path_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    KernelPath *self = (KernelPath *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 + ARGUMENTS[self->op] || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "peermem fast path of %U: expected (async_op, %s), received %zd arguments",
                     self->recording.op, SIGNATURES[self->op], nargs);
        return NULL;
    }
    int async_op = PyObject_IsTrue(args[0]);
    if (async_op < 0) return NULL;
    KernelCall call;
    switch (plan_call(self, args + 1, async_op, &call)) {
        case KERNEL: return run_kernel(self, args + 1, async_op, &call);
        case NCCL: return PyObject_Vectorcall(self->nccl, args, nargs, NULL);
        case TWIN: return PyObject_Vectorcall(self->twin, args, nargs, NULL);
        default: return NULL;
    }
}

static int kernel_path_init(KernelPath *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"op", "device_type", "device", "world", "async_bytes", "default_stream", "launch",
                               "handle", "failed", "comm", "places", "route_of", "order", "raw_stream", "nccl",
                               "twin", "started_work", "launch_failed", "raise_failed", "recording", "push_bytes",
                               "routes", NULL};
    PyObject *launch, *handle, *failed, *objects[10], *recording, *routes = NULL;
    unsigned long long default_stream;
    self->push_bytes = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiiLKOOOOOOOOOOOOOO|KO!", keywords, &self->op,
                                     &self->device_type, &self->device, &self->world, &self->async_bytes,
                                     &default_stream, &launch, &handle, &failed,
                                     &objects[0], &objects[1], &objects[2], &objects[3], &objects[4], &objects[5],
                                     &objects[6], &objects[7], &objects[8], &objects[9], &recording,
                                     &self->push_bytes, &PyDict_Type, &routes)) {
        return -1;
    }
    if (self->op < ALL_REDUCE || self->op > ALL_TO_ALL || self->world < 1 ||
        (self->op == ALL_TO_ALL && self->world > MAX_RANKS)) {
        PyErr_SetString(PyExc_ValueError, "KernelPath: op in 0..3 and a positive world (at most 8 for op 3) expected");
        return -1;
    }
    self->default_stream = (uintptr_t)default_stream;
    void *start = PyLong_AsVoidPtr(launch);  // pm_all_to_all for all_to_all_single, else pm_launch
    self->launch = self->op == ALL_TO_ALL ? NULL : (KernelStart)start;
    self->exchange = self->op == ALL_TO_ALL ? (ExchangeStart)start : NULL;
    self->handle = PyLong_AsVoidPtr(handle);
    self->failed = (const volatile int *)PyLong_AsVoidPtr(failed);
    if (PyErr_Occurred()) return -1;
    if (start == NULL || self->failed == NULL) {
        PyErr_SetString(PyExc_ValueError, "KernelPath: the launch function's and the failure flag's addresses expected");
        return -1;
    }
    if (commlayer_recording_read(recording, &self->recording) < 0) return -1;
    PyObject **slots[10] = {&self->comm, &self->places, &self->route_of, &self->order, &self->raw_stream,
                            &self->nccl, &self->twin, &self->started_work, &self->launch_failed, &self->raise_failed};
    for (int index = 0; index < 10; index++) Py_XSETREF(*slots[index], Py_NewRef(objects[index]));
    Py_XSETREF(self->routes, routes != NULL ? Py_NewRef(routes) : PyDict_New());
    Py_XSETREF(self->device_number, PyLong_FromLong(self->device));
    if (self->routes == NULL || self->device_number == NULL) return -1;
    self->vectorcall = kernel_path_vectorcall;
    return 0;
}

#define KERNEL_PATH_OBJECTS(EACH)                                                                          \
    EACH(comm) EACH(routes) EACH(places) EACH(route_of) EACH(order) EACH(raw_stream) EACH(device_number)      \
        EACH(nccl) EACH(twin) EACH(started_work) EACH(launch_failed) EACH(raise_failed) EACH(last_shape)

static int kernel_path_traverse(KernelPath *self, visitproc visit, void *arg) {
    KERNEL_PATH_OBJECTS(COMMLAYER_VISIT_FIELD)
    return commlayer_recording_traverse(&self->recording, visit, arg);
}

static int kernel_path_clear(KernelPath *self) {
    KERNEL_PATH_OBJECTS(COMMLAYER_CLEAR_FIELD)
    commlayer_recording_clear(&self->recording);
    return 0;
}

COMMLAYER_GC_DEALLOC(kernel_path, KernelPath)

static PyObject *kernel_path_repr(KernelPath *self) {
    return PyUnicode_FromFormat("<commlayer peermem C fast path of %R>", self->recording.op);
}

static PyObject *kernel_path_routes(KernelPath *self, void *closure) {
    (void)closure;
    return PyDict_Copy(self->routes);
}

static PyGetSetDef kernel_path_getset[] = {
    {"routes", (getter)kernel_path_routes, NULL, "the routes looked up so far: bytes << 8 | scalar type -> route",
     NULL},
    {NULL},
};

PyTypeObject KernelPathType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.backends.peermem._fast_paths.KernelPath", KernelPath, kernel_path_init, kernel_path,
        "KernelPath(op, device_type, device, world, async_bytes, default_stream, launch, handle, failed, comm, "
        "places, route_of, order, raw_stream, nccl, twin, started_work, launch_failed, raise_failed, recording, "
        "push_bytes=0, routes=None): run(async_op, *tensors)."),
    .tp_repr = (reprfunc)kernel_path_repr,
    .tp_getset = kernel_path_getset,
};
