// The torch backends' fast paths for their hot ops, in C: commlayer.backends._torch_fast_paths.
//
// One call does what backends/torch_fast_paths.py's Python fast paths do (and what they stay the
// reference for): enter the call in the group's flight recorder ring, call the ProcessGroup's
// bound method with options built once, wrap an async op's torch Work in commlayer's Work (or
// wait for a blocking one) and mark the entry. On the GPU hosts' CPUs the Python version of
// this cost async point-to-point ~1 us more than torch's own wrapper: a Python frame, the
// entry's list, the Work's __init__ frame and its wait frame. Here the fast path is the callable
// itself (vectorcall, no frame), the Work is a C object (work.c: a virtual subclass of
// commlayer's Work) whose untimed wait calls torch's directly, and the recorder entry is built in
// C. module.c makes the module.
//
// Only the Python C API is used (no torch headers): the extension is independent of the torch
// version and calls the ProcessGroup's methods through their Python bindings, as torch's own
// Python wrapper does.
#include "fast_paths.h"

#include "../common/python_module.h"

#include "../common/recorder.h"

enum Shape { LISTED = 0, PAIRED = 1, POINT_TO_POINT = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int shape;    // enum Shape
    int payload;  // PAIRED: which tensor the entry describes (0 output, 1 input)
    PyObject *method, *sync_options, *async_options, *peer, *tag, *work_type;
    CommlayerRecording recording;
    PyObject *last_shape;  // the tuple of sizes the last call's entry holds (tensor meta reader)
} FastPath;

// A 1-D view of tensor (a new reference): the tensor itself when already 1-D (a view costs ~1 us).
// dims < 0: not known yet, asked of the tensor.
static PyObject *flat(PyObject *tensor, Py_ssize_t dims) {
    CommlayerTensorMeta meta;
    if (dims < 0 && tensor_meta_reader != NULL && tensor_meta_reader(tensor, &meta)) dims = meta.dim;
    if (dims < 0) {
        PyObject *counted = PyObject_CallMethodNoArgs(tensor, str_dim);
        if (counted == NULL) return NULL;
        dims = PyLong_AsSsize_t(counted);
        Py_DECREF(counted);
        if (dims < 0 && PyErr_Occurred()) return NULL;
    }
    if (dims == 1) {
        Py_INCREF(tensor);
        return tensor;
    }
    return PyObject_CallMethodOneArg(tensor, str_view, minus_one);
}

// The shape the entry holds (a new reference) and the tensor's dimension count. Where the meta
// reader reads the tensor, a tuple of its sizes: the last call's when they are equal, so a
// loop over same-shaped tensors builds none; otherwise the tensor's torch.Size (a new one per
// read, ~55 ns on the project VM).
static PyObject *shape_of(FastPath *self, PyObject *described, Py_ssize_t *dims) {
    CommlayerTensorMeta meta;
    if (tensor_meta_reader == NULL || !tensor_meta_reader(described, &meta)) {
        PyObject *shape = PyObject_GetAttr(described, str_shape);
        if (shape != NULL) *dims = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;  // torch.Size is a tuple
        return shape;
    }
    *dims = meta.dim;
    return commlayer_tensor_meta_shape(&self->last_shape, &meta);
}

// The ProcessGroup call (a new reference to torch's Work, or None, or NULL with an error set).
static PyObject *call_group(FastPath *self, PyObject *options, PyObject *const *tensors, Py_ssize_t dims) {
    if (self->shape == PAIRED) {
        PyObject *other = tensors[1 - self->payload];
        PyObject *views[2] = {NULL, NULL};
        views[self->payload] = flat(tensors[self->payload], dims);
        views[1 - self->payload] = flat(other, -1);
        PyObject *result = NULL;
        if (views[0] != NULL && views[1] != NULL) {
            PyObject *call_args[3] = {views[0], views[1], options};
            result = PyObject_Vectorcall(self->method, call_args, 3, NULL);
        }
        Py_XDECREF(views[0]);
        Py_XDECREF(views[1]);
        return result;
    }
    PyObject *listed = PyList_New(1);
    if (listed == NULL) return NULL;
    Py_INCREF(tensors[0]);
    PyList_SET_ITEM(listed, 0, tensors[0]);
    PyObject *result;
    if (self->shape == POINT_TO_POINT) {
        PyObject *call_args[3] = {listed, self->peer, self->tag};
        result = PyObject_Vectorcall(self->method, call_args, 3, NULL);
    } else {
        PyObject *call_args[2] = {listed, options};
        result = PyObject_Vectorcall(self->method, call_args, 2, NULL);
    }
    Py_DECREF(listed);
    return result;
}

// commlayer's Work around torch's, built without its __init__ frame (two attribute stores).
static PyObject *new_work(PyTypeObject *type, PyObject *torch_work, PyObject *result_tensor) {
    PyObject *work = type->tp_new(type, empty_tuple, NULL);
    if (work == NULL) return NULL;
    PyObject *results = PyTuple_Pack(1, result_tensor);
    if (results == NULL || PyObject_SetAttr(work, str_result, results) < 0 ||
        PyObject_SetAttr(work, str_torch_work, torch_work) < 0) {
        Py_XDECREF(results);
        Py_DECREF(work);
        return NULL;
    }
    Py_DECREF(results);
    return work;
}

static PyObject *finish(FastPath *self, PyObject *entry, PyObject *torch_work, int async_op, PyObject *result_tensor) {
    if (async_op) {
        PyObject *work = self->work_type == (PyObject *)&CWorkType
                             ? cwork_new(torch_work, result_tensor)
                             : new_work((PyTypeObject *)self->work_type, torch_work, result_tensor);
        if (work == NULL || commlayer_recorder_track(entry, work) < 0) {
            Py_XDECREF(work);
            return NULL;
        }
        return work;
    }
    if (torch_work != Py_None) {  // NCCL may run a blocking op on the caller's stream: no Work
        PyObject *waited = PyObject_CallMethodNoArgs(torch_work, str_wait);
        if (waited == NULL) return commlayer_recorder_fail(&self->recording);
        Py_DECREF(waited);
    }
    if (commlayer_recorder_complete(&self->recording, entry) < 0) return NULL;
    Py_RETURN_NONE;
}

// run(async_op, tensor) or, PAIRED, run(async_op, output, input): the fast path's whole call.
static PyObject *fast_path_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    FastPath *self = (FastPath *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), tensors = self->shape == PAIRED ? 2 : 1;
    if (nargs != 1 + tensors || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "fast path of %U: expected (async_op, %zd tensor(s)), received %zd arguments",
                     self->recording.op, tensors, nargs);
        return NULL;
    }
    int async_op = PyObject_IsTrue(args[0]);
    if (async_op < 0) return NULL;
    PyObject *const *operands = args + 1;
    Py_ssize_t dims = -1;
    PyObject *shape = shape_of(self, operands[self->shape == PAIRED ? self->payload : 0], &dims);
    PyObject *entry = shape == NULL ? NULL : commlayer_recorder_enter(&self->recording, shape);
    if (entry == NULL) return NULL;
    PyObject *options = async_op ? self->async_options : self->sync_options;
    PyObject *torch_work = call_group(self, options, operands, dims);
    PyObject *result = torch_work == NULL ? commlayer_recorder_fail(&self->recording)
                                          : finish(self, entry, torch_work, async_op, operands[0]);
    Py_XDECREF(torch_work);
    Py_DECREF(entry);
    return result;
}

static int fast_path_init(FastPath *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"shape",   "method",    "sync_options", "async_options", "peer", "tag",
                               "payload", "recording", "work_type",    NULL};
    PyObject *fields[5], *recording, *work_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOOOOiOO!", keywords, &self->shape, &fields[0], &fields[1],
                                     &fields[2], &fields[3], &fields[4], &self->payload, &recording, &PyType_Type,
                                     &work_type)) {
        return -1;
    }
    if (self->shape < LISTED || self->shape > POINT_TO_POINT || self->payload < 0 || self->payload > 1) {
        PyErr_SetString(PyExc_ValueError, "FastPath: shape in 0..2 and payload 0 or 1 expected");
        return -1;
    }
    if (commlayer_recording_read(recording, &self->recording) < 0) return -1;
    PyObject **slots[5] = {&self->method, &self->sync_options, &self->async_options, &self->peer, &self->tag};
    for (int index = 0; index < 5; index++) Py_XSETREF(*slots[index], Py_NewRef(fields[index]));
    Py_XSETREF(self->work_type, Py_NewRef(work_type));
    self->vectorcall = fast_path_vectorcall;
    return 0;
}

#define FAST_PATH_OBJECTS(EACH) \
    EACH(method) EACH(sync_options) EACH(async_options) EACH(peer) EACH(tag) EACH(work_type) EACH(last_shape)

static int fast_path_traverse(FastPath *self, visitproc visit, void *arg) {
    FAST_PATH_OBJECTS(COMMLAYER_VISIT_FIELD)
    return commlayer_recording_traverse(&self->recording, visit, arg);
}

static int fast_path_clear(FastPath *self) {
    FAST_PATH_OBJECTS(COMMLAYER_CLEAR_FIELD)
    commlayer_recording_clear(&self->recording);
    return 0;
}

COMMLAYER_GC_DEALLOC(fast_path, FastPath)

static PyObject *fast_path_repr(FastPath *self) {
    return PyUnicode_FromFormat("<commlayer C fast path of %R>", self->recording.op);
}

static PyObject *fast_path_op(FastPath *self, void *closure) {
    (void)closure;
    return Py_NewRef(self->recording.op != NULL ? self->recording.op : Py_None);
}

static PyGetSetDef fast_path_getset[] = {
    {"op", (getter)fast_path_op, NULL, "the op as the flight recorder enters it", NULL},
    {NULL},
};

PyTypeObject FastPathType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.backends._torch_fast_paths.FastPath", FastPath, fast_path_init, fast_path,
        "FastPath(shape, method, sync_options, async_options, peer, tag, payload, recording, work_type): "
        "run(async_op, *tensors), recorded as the flight_recorder.Recording says."),
    .tp_repr = (reprfunc)fast_path_repr,
    .tp_getset = fast_path_getset,
};
