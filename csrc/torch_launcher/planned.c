// The planned point-to-point lookup of commlayer.backends._torch_launcher (PlannedP2P).
#include "launcher.h"

// PlannedP2P(plans, kind, async_op, no_plan): called as (tensor, peer, group, tag, group_peer),
// it runs the plan of commlayer.dist._p2p's key (kind, group, peer, tag, dtype, device, layout)
// when one exists, the peer is an int, group_peer is None and the tensor is contiguous, and
// returns no_plan otherwise (the Python path then validates, plans or refuses the call). The
// Python lookup it replaces cost isend ~0.45 us of its ~0.8 us on the project VM.
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *plans, *kind, *async_op, *no_plan;
} PlannedP2P;

static PyObject *plan_key(PlannedP2P *self, PyObject *tensor, PyObject *peer, PyObject *group, PyObject *tag) {
    PyObject *dtype = PyObject_GetAttr(tensor, str_dtype);
    PyObject *device = dtype == NULL ? NULL : PyObject_GetAttr(tensor, str_device);
    PyObject *layout = device == NULL ? NULL : PyObject_GetAttr(tensor, str_layout);
    if (layout == NULL) {
        Py_XDECREF(dtype);
        Py_XDECREF(device);
        return NULL;
    }
    PyObject *key = PyTuple_New(7);
    if (key == NULL) {
        Py_DECREF(dtype);
        Py_DECREF(device);
        Py_DECREF(layout);
        return NULL;
    }
    PyObject *items[7] = {self->kind, group, peer, tag, dtype, device, layout};
    for (int index = 0; index < 7; index++) {
        if (index < 4) Py_INCREF(items[index]);
        PyTuple_SET_ITEM(key, index, items[index]);
    }
    return key;
}

static PyObject *planned_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PlannedP2P *self = (PlannedP2P *)callable;
    if (PyVectorcall_NARGS(nargsf) != 5 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "PlannedP2P: expected (tensor, peer, group, tag, group_peer)");
        return NULL;
    }
    PyObject *tensor = args[0], *peer = args[1];
    // An int peer only: True and 1.0 equal 1 as keys, and they must still be refused.
    if (!PyLong_CheckExact(peer) || args[4] != Py_None) return Py_NewRef(self->no_plan);
    PyObject *key = plan_key(self, tensor, peer, args[2], args[3]);
    if (key == NULL) {  // not a tensor: the Python path names the argument
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
        PyErr_Clear();
        return Py_NewRef(self->no_plan);
    }
    PyObject *plan = PyDict_GetItemWithError(self->plans, key);  // borrowed
    Py_DECREF(key);
    if (plan == NULL) {
        if (PyErr_Occurred()) {  // an unhashable group or tag: the Python path refuses it
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear();
        }
        return Py_NewRef(self->no_plan);
    }
    Py_INCREF(plan);  // a concurrent forget_plans() must not free it under us
    PyObject *contiguous = PyObject_CallMethodNoArgs(tensor, str_is_contiguous);
    PyObject *result = NULL;
    if (contiguous == Py_True) {
        PyObject *run = PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) > 0 ? PyTuple_GET_ITEM(plan, 0) : NULL;
        PyObject *call_args[2] = {self->async_op, tensor};
        result = run == NULL ? Py_NewRef(self->no_plan) : PyObject_Vectorcall(run, call_args, 2, NULL);
    } else if (contiguous != NULL) {
        result = Py_NewRef(self->no_plan);  // staged by the Python path
    }
    Py_XDECREF(contiguous);
    Py_DECREF(plan);
    return result;
}

static int planned_init(PlannedP2P *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"plans", "kind", "async_op", "no_plan", NULL};
    PyObject *plans, *kind, *async_op, *no_plan;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!UO!O", keywords, &PyDict_Type, &plans, &kind, &PyBool_Type,
                                     &async_op, &no_plan)) {
        return -1;
    }
    Py_XSETREF(self->plans, Py_NewRef(plans));
    Py_XSETREF(self->kind, Py_NewRef(kind));
    Py_XSETREF(self->async_op, Py_NewRef(async_op));
    Py_XSETREF(self->no_plan, Py_NewRef(no_plan));
    self->vectorcall = planned_vectorcall;
    return 0;
}

static int planned_traverse(PlannedP2P *self, visitproc visit, void *arg) {
    Py_VISIT(self->plans);
    Py_VISIT(self->kind);
    Py_VISIT(self->async_op);
    Py_VISIT(self->no_plan);
    return 0;
}

static int planned_clear(PlannedP2P *self) {
    Py_CLEAR(self->plans);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->async_op);
    Py_CLEAR(self->no_plan);
    return 0;
}

static void planned_dealloc(PlannedP2P *self) {
    PyObject_GC_UnTrack(self);
    planned_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject PlannedP2PType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commlayer.backends._torch_launcher.PlannedP2P",
    .tp_basicsize = sizeof(PlannedP2P),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PlannedP2P(plans, kind, async_op, no_plan)(tensor, peer, group, tag, group_peer): a planned "
              "send or recv, or no_plan.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)planned_init,
    .tp_dealloc = (destructor)planned_dealloc,
    .tp_traverse = (traverseproc)planned_traverse,
    .tp_clear = (inquiry)planned_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PlannedP2P, vectorcall),
};

