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
// the twin: large asynchronous calls (they may move to the group's stream) and tensors the reader
// cannot read.
//
// Only the Python C API is used: the kernel library is loaded at run time (ctypes), and its launch
// function reaches this file as an address.
#include "peermem_fast_paths.h"

#include "../common/python_module.h"
#include "../common/recorder.h"

// pm_launch in csrc/peermem/kernels.cu: (comm, code, in, out, bytes, blocks, stream, in_slot,
// out_slot, in_off, out_off, descriptor) -> 0 or an error code.
typedef int (*KernelStart)(void *, int, const void *, void *, unsigned long long, int, void *, int, int,
                              unsigned long long, unsigned long long, int);

enum Op { ALL_REDUCE = 0, ALL_GATHER = 1, REDUCE_SCATTER = 2 };
enum Verdict { FAILED = -1, KERNEL = 0, NCCL = 1, TWIN = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int op, device_type, device, world;  // the device (c10's type and index) the kernels serve
    long long async_bytes;  // asynchronous calls of at least this many bytes go to the twin (< 0: none)
    KernelStart launch;
    void *handle;
    const volatile int *failed;  // the group's flag, set by a kernel that timed out
    PyObject *comm;              // its handle is None once the group's region is freed
    PyObject *routes;  // bytes << 8 | scalar type -> (code, blocks[, placed]) or None (NCCL); else: the twin
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

// How the call runs: the kernel (with *call filled in), NCCL's fast path, or the twin.
static enum Verdict plan_call(KernelPath *self, PyObject *const *tensors, int async_op, KernelCall *call) {
    if (tensor_meta_reader == NULL || !attached(self)) return TWIN;
    int pair = self->op != ALL_REDUCE;
    CommlayerTensorMeta first, second;
    if (!tensor_meta_reader(tensors[0], &first) || !readable(&first, self)) return TWIN;
    if (pair && (!tensor_meta_reader(tensors[1], &second) || !readable(&second, self) ||
                 second.scalar_type != first.scalar_type)) {
        return TWIN;
    }
    const CommlayerTensorMeta *routed = self->op == REDUCE_SCATTER ? &second : &first;
    long long nbytes = commlayer_tensor_meta_numel(routed) * routed->itemsize;
    PyObject *route = route_for(self, tensors[self->op == REDUCE_SCATTER], nbytes, routed->scalar_type);
    if (route == NULL) return FAILED;
    if (route == Py_None) return NCCL;
    Py_ssize_t items = PyTuple_Check(route) ? PyTuple_GET_SIZE(route) : 0;
    if (items != 2 && items != 3) return TWIN;
    long long moved = pair ? commlayer_tensor_meta_numel(&second) * second.itemsize : nbytes;
    if (async_op && self->async_bytes >= 0 && (nbytes >= self->async_bytes || moved >= self->async_bytes)) {
        return TWIN;
    }
    int same = on_last_stream(self, &call->stream);
    if (same < 0) return FAILED;
    call->switched = !same;
    call->placed = items == 3;
    call->places = UNPLACED;
    call->code = (int)PyLong_AsLong(PyTuple_GET_ITEM(route, 0));
    call->blocks = (int)PyLong_AsLong(PyTuple_GET_ITEM(route, 1));
    call->output = first.data;  // all_reduce's one tensor, or the output of the other two
    call->source = pair ? second.data : first.data;
    call->bytes = (unsigned long long)(pair ? nbytes / self->world : nbytes);
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

// run(async_op, tensor) for all_reduce, run(async_op, output, input) for the other two.
static PyObject *kernel_path_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames) {
    KernelPath *self = (KernelPath *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), tensors = self->op == ALL_REDUCE ? 1 : 2;
    if (nargs != 1 + tensors || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "peermem fast path of %U: expected (async_op, %zd tensor(s)), received %zd "
                     "arguments", self->recording.op, tensors, nargs);
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
    static char *keywords[] = {"op", "device_type", "device", "world", "async_bytes", "launch", "handle", "failed", "comm",
                               "places", "route_of", "order", "raw_stream", "nccl", "twin", "started_work",
                               "launch_failed", "raise_failed", "recording", NULL};
    PyObject *launch, *handle, *failed, *objects[10], *recording;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiiLOOOOOOOOOOOOOO", keywords, &self->op, &self->device_type,
                                     &self->device, &self->world, &self->async_bytes, &launch, &handle, &failed,
                                     &objects[0], &objects[1], &objects[2], &objects[3], &objects[4], &objects[5],
                                     &objects[6], &objects[7], &objects[8], &objects[9], &recording)) {
        return -1;
    }
    if (self->op < ALL_REDUCE || self->op > REDUCE_SCATTER || self->world < 1) {
        PyErr_SetString(PyExc_ValueError, "KernelPath: op in 0..2 and a positive world expected");
        return -1;
    }
    self->launch = (KernelStart)PyLong_AsVoidPtr(launch);
    self->handle = PyLong_AsVoidPtr(handle);
    self->failed = (const volatile int *)PyLong_AsVoidPtr(failed);
    if (PyErr_Occurred()) return -1;
    if (self->launch == NULL || self->failed == NULL) {
        PyErr_SetString(PyExc_ValueError, "KernelPath: the launch function's and the failure flag's addresses expected");
        return -1;
    }
    if (commlayer_recording_read(recording, &self->recording) < 0) return -1;
    PyObject **slots[10] = {&self->comm, &self->places, &self->route_of, &self->order, &self->raw_stream,
                            &self->nccl, &self->twin, &self->started_work, &self->launch_failed, &self->raise_failed};
    for (int index = 0; index < 10; index++) Py_XSETREF(*slots[index], Py_NewRef(objects[index]));
    Py_XSETREF(self->routes, PyDict_New());
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
        "KernelPath(op, device_type, device, world, async_bytes, launch, handle, failed, comm, places, route_of, "
        "order, raw_stream, nccl, twin, started_work, launch_failed, raise_failed, recording): "
        "run(async_op, *tensors)."),
    .tp_repr = (reprfunc)kernel_path_repr,
    .tp_getset = kernel_path_getset,
};
