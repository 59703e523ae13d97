// Fused launchers for the torch backends' hot ops, in C: commlayer.backends._torch_fast_paths.
//
// One call does what backends/torch_fast_paths.py's Python launchers do (and what they stay the
// reference for): enter the call in the group's flight recorder ring, call the ProcessGroup's
// bound method with options built once, wrap an async op's torch Work in commlayer's Work (or
// wait for a blocking one) and mark the entry. On the GPU hosts' CPUs the Python version of
// this cost async point-to-point ~1 us more than torch's own wrapper: a Python frame, the
// entry's list, the Work's __init__ frame and its wait frame. Here the launcher is the callable
// itself (vectorcall, no frame), the Work is a C object (work.c: a virtual subclass of
// commlayer's Work) whose untimed wait calls torch's directly, and the recorder entry is built in
// C. planned.c looks isend/irecv/send/recv's plans up; module.c makes the module.
//
// Only the Python C API is used (no torch headers): the extension is independent of the torch
// version and calls the ProcessGroup's methods through their Python bindings, as torch's own
// Python wrapper does.
#include "fast_paths.h"

#include <time.h>

enum Shape { LISTED = 0, PAIRED = 1, POINT_TO_POINT = 2 };

// Entry slots, as commlayer.core.flight_recorder numbers them (SEQ, OP, ..., WORK).
enum { SEQ, OP, SHAPE, DTYPE, ROOT, STATE, QUEUED_NS, COMPLETED_NS, WORK, ENTRY_SLOTS };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int shape;    // enum Shape
    int payload;  // PAIRED: which tensor the entry describes (0 output, 1 input)
    Py_ssize_t capacity;
    PyObject *method, *sync_options, *async_options, *peer, *tag;
    PyObject *counter, *ring, *op, *dtype, *root, *started, *completed, *fail, *work_type;
    PyObject *last_shape;  // the tuple of sizes the last call's entry holds (tensor meta reader)
} Launcher;

static PyObject *now_ns(void) {
    struct timespec now;  // CLOCK_MONOTONIC: what time.monotonic_ns reads on Linux
    clock_gettime(CLOCK_MONOTONIC, &now);
    return PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
}

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

static void untrack(PyObject *object) {
    if (PyObject_IS_GC(object) && PyObject_GC_IsTracked(object)) PyObject_GC_UnTrack(object);
}

// Whether shape (a tuple of ints, or NULL) holds meta's sizes.
static int same_sizes(PyObject *shape, const CommlayerTensorMeta *meta) {
    if (shape == NULL || PyTuple_GET_SIZE(shape) != meta->dim) return 0;
    for (Py_ssize_t index = 0; index < meta->dim; index++) {
        if (PyLong_AsLongLong(PyTuple_GET_ITEM(shape, index)) != meta->sizes[index]) return 0;
    }
    return 1;
}

static PyObject *sizes_tuple(const CommlayerTensorMeta *meta) {
    PyObject *shape = PyTuple_New(meta->dim);
    for (Py_ssize_t index = 0; shape != NULL && index < meta->dim; index++) {
        PyObject *size = PyLong_FromLongLong(meta->sizes[index]);
        if (size == NULL) Py_CLEAR(shape);
        else PyTuple_SET_ITEM(shape, index, size);
    }
    return shape;
}

// The shape the entry holds (a new reference) and the tensor's dimension count. Where the meta
// reader reads the tensor, a tuple of its sizes: the last call's when they are equal, so a
// loop over same-shaped tensors builds none; otherwise the tensor's torch.Size (a new one per
// read, ~55 ns on the project VM).
static PyObject *shape_of(Launcher *self, PyObject *described, Py_ssize_t *dims) {
    CommlayerTensorMeta meta;
    if (tensor_meta_reader == NULL || !tensor_meta_reader(described, &meta)) {
        PyObject *shape = PyObject_GetAttr(described, str_shape);
        if (shape != NULL) *dims = PyTuple_Check(shape) ? PyTuple_GET_SIZE(shape) : -1;  // torch.Size is a tuple
        return shape;
    }
    *dims = meta.dim;
    if (!same_sizes(self->last_shape, &meta)) {
        PyObject *shape = sizes_tuple(&meta);
        if (shape == NULL) return NULL;
        Py_XSETREF(self->last_shape, shape);
    }
    return Py_NewRef(self->last_shape);
}

// The ring's evicted entry when nothing but the ring refers to it: rewritten in place, it spares
// a list's allocation and release per call (nobody can see the difference: no one else holds it).
static PyObject *reusable(PyObject *evicted) {
    if (evicted == NULL || !PyList_CheckExact(evicted) || Py_REFCNT(evicted) != 1) return NULL;
    return PyList_GET_SIZE(evicted) == ENTRY_SLOTS ? evicted : NULL;
}

// entry's slots set to items (seq, shape and queued are new references, stolen; the rest are
// borrowed); the previous ones are released once all are in place.
static void refill(PyObject *entry, PyObject *const *items) {
    PyObject *previous[ENTRY_SLOTS];
    for (int index = 0; index < ENTRY_SLOTS; index++) {
        previous[index] = PyList_GET_ITEM(entry, index);
        if (index != SEQ && index != SHAPE && index != QUEUED_NS) Py_INCREF(items[index]);
        PyList_SET_ITEM(entry, index, items[index]);
    }
    for (int index = 0; index < ENTRY_SLOTS; index++) Py_XDECREF(previous[index]);
}

// The recorder entry [seq, op, shape, dtype, root, started, now, 0, None], stored in the ring.
static PyObject *enter(Launcher *self, PyObject *described, Py_ssize_t *dims) {
    PyObject *seq = PyIter_Next(self->counter);
    if (seq == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "flight recorder counter ended");
        return NULL;
    }
    Py_ssize_t slot = PyLong_AsSsize_t(seq) % self->capacity;
    PyObject *shape = shape_of(self, described, dims);
    PyObject *queued = now_ns();
    PyObject *entry = slot < 0 ? NULL : reusable(PyList_GET_ITEM(self->ring, slot));
    if (entry != NULL && shape != NULL && queued != NULL) {
        PyObject *items[ENTRY_SLOTS] = {seq, self->op, shape, self->dtype, self->root, self->started, queued, zero, Py_None};
        untrack(shape);
        refill(entry, items);
        return Py_NewRef(entry);
    }
    entry = PyList_New(ENTRY_SLOTS);
    if (shape == NULL || queued == NULL || entry == NULL || (slot < 0 && PyErr_Occurred())) {
        Py_DECREF(seq);
        Py_XDECREF(shape);
        Py_XDECREF(queued);
        Py_XDECREF(entry);
        return NULL;
    }
    PyObject *items[ENTRY_SLOTS] = {seq,          self->op, shape, self->dtype, self->root,
                                    self->started, queued,  zero,  Py_None};
    for (int index = 0; index < ENTRY_SLOTS; index++) {
        if (index != SEQ && index != SHAPE && index != QUEUED_NS) Py_INCREF(items[index]);
        PyList_SET_ITEM(entry, index, items[index]);
    }
    // Nothing in the entry can refer back to it (ints, strs, a dtype, a shape of ints, a weak
    // reference without callback), so neither it nor its shape can be part of a cycle: untracked,
    // the ring's thousands of objects stay out of every collection's traversal. (Once the ring
    // is full each call frees an entry as it makes one, so tracked entries would not trigger
    // collections either: this only makes those the program triggers a little cheaper.)
    PyObject_GC_UnTrack(entry);
    untrack(shape);
    Py_INCREF(entry);
    PyList_SetItem(self->ring, slot, entry);  // steals the new reference; drops the old entry
    return entry;
}

// The ProcessGroup call (a new reference to torch's Work, or None, or NULL with an error set).
static PyObject *call_group(Launcher *self, PyObject *options, PyObject *const *tensors, Py_ssize_t dims) {
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

// With an exception set: hand it to fail(error), which raises it or its typed translation, as
// the Python launchers do inside their except block. Other BaseExceptions pass through.
static PyObject *translate_failure(Launcher *self) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) PyException_SetTraceback(value, traceback);
    PyObject *handled = PyErr_GetHandledException();  // fail() runs as if in an except block
    PyErr_SetHandledException(value);
    PyObject *returned = PyObject_CallOneArg(self->fail, value);
    PyErr_SetHandledException(handled);
    Py_XDECREF(handled);
    if (returned != NULL) {  // fail() must raise; if it did not, the original error stands
        Py_DECREF(returned);
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return NULL;
}

static PyObject *finish(Launcher *self, PyObject *entry, PyObject *torch_work, int async_op, PyObject *result_tensor) {
    if (async_op) {
        PyObject *work = self->work_type == (PyObject *)&CWorkType
                             ? cwork_new(torch_work, result_tensor)
                             : new_work((PyTypeObject *)self->work_type, torch_work, result_tensor);
        PyObject *weak = work == NULL ? NULL : PyWeakref_NewRef(work, NULL);
        if (weak == NULL) {
            Py_XDECREF(work);
            return NULL;
        }
        untrack(weak);  // as the entry: it has no callback and refers to the Work weakly
        PyList_SetItem(entry, WORK, weak);
        return work;
    }
    if (torch_work != Py_None) {  // NCCL may run a blocking op on the caller's stream: no Work
        PyObject *waited = PyObject_CallMethodNoArgs(torch_work, str_wait);
        if (waited == NULL) return translate_failure(self);
        Py_DECREF(waited);
    }
    PyObject *completed_ns = now_ns();
    if (completed_ns == NULL) return NULL;
    Py_INCREF(self->completed);
    PyList_SetItem(entry, STATE, self->completed);
    PyList_SetItem(entry, COMPLETED_NS, completed_ns);
    Py_RETURN_NONE;
}

// run(async_op, tensor) or, PAIRED, run(async_op, output, input): the launcher's whole call.
static PyObject *launcher_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Launcher *self = (Launcher *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), tensors = self->shape == PAIRED ? 2 : 1;
    if (nargs != 1 + tensors || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "launcher of %U: expected (async_op, %zd tensor(s)), received %zd arguments",
                     self->op, tensors, nargs);
        return NULL;
    }
    int async_op = PyObject_IsTrue(args[0]);
    if (async_op < 0) return NULL;
    PyObject *const *operands = args + 1;
    Py_ssize_t dims = -1;
    PyObject *entry = enter(self, operands[self->shape == PAIRED ? self->payload : 0], &dims);
    if (entry == NULL) return NULL;
    PyObject *options = async_op ? self->async_options : self->sync_options;
    PyObject *torch_work = call_group(self, options, operands, dims);
    PyObject *result = torch_work == NULL ? translate_failure(self) : finish(self, entry, torch_work, async_op, operands[0]);
    Py_XDECREF(torch_work);
    Py_DECREF(entry);
    return result;
}

static int launcher_init(Launcher *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"shape", "method", "sync_options", "async_options", "peer", "tag", "payload",
                               "counter", "ring", "op", "dtype", "root", "started", "completed", "fail",
                               "work_type", NULL};
    PyObject *fields[14];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOOOOiOO!OOOOOOO!", keywords, &self->shape, &fields[0],
                                     &fields[1], &fields[2], &fields[3], &fields[4], &self->payload,
                                     &fields[5], &PyList_Type, &fields[6], &fields[7], &fields[8], &fields[9],
                                     &fields[10], &fields[11], &fields[12], &PyType_Type, &fields[13])) {
        return -1;
    }
    if (self->shape < LISTED || self->shape > POINT_TO_POINT || self->payload < 0 || self->payload > 1 ||
        PyList_GET_SIZE(fields[6]) == 0) {
        PyErr_SetString(PyExc_ValueError, "Launcher: shape in 0..2, payload 0 or 1 and a non-empty ring expected");
        return -1;
    }
    PyObject **slots[14] = {&self->method, &self->sync_options, &self->async_options, &self->peer, &self->tag,
                            &self->counter, &self->ring,   &self->op,      &self->dtype, &self->root,
                            &self->started, &self->completed, &self->fail, &self->work_type};
    for (int index = 0; index < 14; index++) {
        Py_INCREF(fields[index]);
        Py_XSETREF(*slots[index], fields[index]);
    }
    self->capacity = PyList_GET_SIZE(self->ring);  // the ring never changes size
    self->vectorcall = launcher_vectorcall;
    return 0;
}

static int launcher_traverse(Launcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->method);
    Py_VISIT(self->sync_options);
    Py_VISIT(self->async_options);
    Py_VISIT(self->peer);
    Py_VISIT(self->tag);
    Py_VISIT(self->counter);
    Py_VISIT(self->ring);
    Py_VISIT(self->op);
    Py_VISIT(self->dtype);
    Py_VISIT(self->root);
    Py_VISIT(self->started);
    Py_VISIT(self->completed);
    Py_VISIT(self->fail);
    Py_VISIT(self->work_type);
    Py_VISIT(self->last_shape);
    return 0;
}

static int launcher_clear(Launcher *self) {
    Py_CLEAR(self->method);
    Py_CLEAR(self->sync_options);
    Py_CLEAR(self->async_options);
    Py_CLEAR(self->peer);
    Py_CLEAR(self->tag);
    Py_CLEAR(self->counter);
    Py_CLEAR(self->ring);
    Py_CLEAR(self->op);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->root);
    Py_CLEAR(self->started);
    Py_CLEAR(self->completed);
    Py_CLEAR(self->fail);
    Py_CLEAR(self->work_type);
    Py_CLEAR(self->last_shape);
    return 0;
}

static void launcher_dealloc(Launcher *self) {
    PyObject_GC_UnTrack(self);
    launcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *launcher_repr(Launcher *self) {
    return PyUnicode_FromFormat("<commlayer C launcher of %R>", self->op);
}

static PyMemberDef launcher_members[] = {
    {"op", T_OBJECT, offsetof(Launcher, op), READONLY, "the op as the flight recorder enters it"},
    {NULL},
};

PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commlayer.backends._torch_fast_paths.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Launcher(shape, method, sync_options, async_options, peer, tag, payload, counter, ring, op, "
              "dtype, root, started, completed, fail, work_type): run(async_op, *tensors), recorded.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)launcher_init,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_traverse = (traverseproc)launcher_traverse,
    .tp_clear = (inquiry)launcher_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_repr = (reprfunc)launcher_repr,
    .tp_members = launcher_members,
};

