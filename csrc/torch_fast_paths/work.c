// The C Work of commlayer.backends._torch_fast_paths: what an async fast path returns.
#include "fast_paths.h"

#include "../common/python_module.h"

// Work(torch_work, result): what an async fast path returns, a virtual subclass of commlayer's Work
// (registered by backends/torch_fast_paths.py). Building a Python Work and its instance dict, and a
// Python frame for its wait, cost isend(...).wait() ~0.3 us on the GPU hosts' CPUs; this one is
// three pointers, and its untimed wait calls torch's directly. Anything else (a timed wait,
// then(), get_future(), is_completed(), ...) is answered by a Python TorchWork built on first
// use ("materialised"), which is told if torch's wait already ran: a second wait on a finished
// gloo recv would block.
typedef struct {
    PyObject_HEAD
    PyObject *torch_work, *result, *full, *weakrefs;  // result: the one result tensor
    int done;
} CWork;

// commlayer.core.work.TorchWork (the materialised form) and _raise_typed (a failed wait's error).
static PyObject *python_work_type, *on_wait_error;

PyObject *cwork_new(PyObject *torch_work, PyObject *result_tensor) {
    CWork *work = PyObject_GC_New(CWork, &CWorkType);
    if (work == NULL) return NULL;
    work->result = Py_NewRef(result_tensor);  // the materialised Work's tuple is built on first use
    work->torch_work = Py_NewRef(torch_work);
    work->full = work->weakrefs = NULL;
    work->done = 0;
    PyObject_GC_Track(work);
    return (PyObject *)work;
}

static PyObject *materialised(CWork *self) {
    if (self->full == NULL) {
        if (python_work_type == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "commlayer C Work: work_support() was not called");
            return NULL;
        }
        PyObject *results = PyTuple_Pack(1, self->result);
        if (results == NULL) return NULL;
        PyObject *full = PyObject_CallFunctionObjArgs(python_work_type, self->torch_work, results, NULL);
        Py_DECREF(results);
        if (full == NULL) return NULL;
        if (self->done && PyObject_SetAttr(full, str_done, Py_True) < 0) {
            Py_DECREF(full);
            return NULL;
        }
        self->full = full;
    }
    return self->full;
}

// wait(timeout=None): untimed and first -> torch's wait; otherwise the materialised Work's.
static PyObject *cwork_wait(CWork *self, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t given = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    if (self->full != NULL || self->done || !(given == 0 || (given == 1 && args[0] == Py_None))) {
        PyObject *full = materialised(self);
        if (full == NULL) return NULL;
        PyObject *wait = PyObject_GetAttr(full, str_wait);
        if (wait == NULL) return NULL;
        PyObject *waited = PyObject_Vectorcall(wait, args, nargs, kwnames);
        Py_DECREF(wait);
        return waited;
    }
    PyObject *waited = PyObject_CallMethodNoArgs(self->torch_work, str_wait);
    if (waited == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError) || on_wait_error == NULL) return NULL;
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL) PyException_SetTraceback(value, traceback);
        PyObject *raised = PyObject_CallFunctionObjArgs(on_wait_error, (PyObject *)self, value, NULL);
        if (raised != NULL) {  // it must raise; should it not, the original error stands
            Py_DECREF(raised);
            PyErr_Restore(type, value, traceback);
        } else {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
        }
        return NULL;
    }
    Py_DECREF(waited);
    self->done = 1;
    Py_RETURN_TRUE;
}

// The rest of Work's interface, answered by the materialised Work. Named one by one (rather than
// a tp_getattro falling back to it) so that attribute reads stay CPython's generic ones, which
// its interpreter specialises: a fallback getattro made every work.wait() build a bound method.
static PyObject *forwarded(CWork *self, void *name) {
    PyObject *full = materialised(self);
    return full == NULL ? NULL : PyObject_GetAttrString(full, (const char *)name);
}

#define FORWARDED(name) {name, (getter)forwarded, NULL, "as commlayer.core.work.Work's", name}
static PyGetSetDef cwork_forwarded[] = {
    FORWARDED("is_completed"), FORWARDED("is_success"), FORWARDED("exception"), FORWARDED("result"),
    FORWARDED("source_rank"),  FORWARDED("_source_rank"), FORWARDED("then"),    FORWARDED("get_future"),
    FORWARDED("_test"),        FORWARDED("_block"),     FORWARDED("_on_complete"), FORWARDED("_complete"),
    FORWARDED("_done"),        FORWARDED("_error"),     FORWARDED("_pending_note"), FORWARDED("_result"),
    {NULL},
};
#undef FORWARDED

#define CWORK_OBJECTS(EACH) EACH(torch_work) EACH(result) EACH(full)
COMMLAYER_GC_FIELDS(cwork, CWork, CWORK_OBJECTS)

static void cwork_dealloc(CWork *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    cwork_clear(self);
    PyObject_GC_Del(self);
}

static PyMethodDef cwork_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))cwork_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None): block until done, as commlayer.core.work.Work.wait."},
    {NULL},
};

static PyMemberDef cwork_members[] = {
    {"torch_work", T_OBJECT, offsetof(CWork, torch_work), READONLY, "torch's Work"},
    {NULL},
};

PyTypeObject CWorkType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commlayer.backends._torch_fast_paths.Work",
    .tp_basicsize = sizeof(CWork),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The Work of a C fast path's async op (a virtual commlayer.core.work.Work).",
    .tp_dealloc = (destructor)cwork_dealloc,
    .tp_traverse = (traverseproc)cwork_traverse,
    .tp_clear = (inquiry)cwork_clear,
    .tp_methods = cwork_methods,
    .tp_members = cwork_members,
    .tp_getset = cwork_forwarded,
    .tp_weaklistoffset = offsetof(CWork, weakrefs),
};

// work_support(TorchWork, raise_typed): set once, before any fast path runs, by backends/torch_fast_paths.py.
PyObject *work_support(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *work_type, *on_error;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &work_type, &on_error)) return NULL;
    Py_XSETREF(python_work_type, Py_NewRef(work_type));
    Py_XSETREF(on_wait_error, Py_NewRef(on_error));
    return Py_NewRef((PyObject *)&CWorkType);
}

