// The planned lookups of commlayer.backends._torch_launcher: point-to-point (PlannedP2P) and the
// one-tensor collectives (PlannedCollective: all_reduce, broadcast).
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
    int int_scalar;  // PlannedCollective: the scalar must be an int (a root), not merely equal one
} PlannedP2P;

// (head..., tensor.dtype, tensor.device, tensor.layout): a plan key of commlayer.dist; NULL with
// an exception set (AttributeError: not a tensor).
static PyObject *plan_key(PyObject *const *head, Py_ssize_t heads, PyObject *tensor) {
    PyObject *dtype = PyObject_GetAttr(tensor, str_dtype);
    PyObject *device = dtype == NULL ? NULL : PyObject_GetAttr(tensor, str_device);
    PyObject *layout = device == NULL ? NULL : PyObject_GetAttr(tensor, str_layout);
    PyObject *key = layout == NULL ? NULL : PyTuple_New(heads + 3);
    if (key == NULL) {
        Py_XDECREF(dtype);
        Py_XDECREF(device);
        Py_XDECREF(layout);
        return NULL;
    }
    for (Py_ssize_t index = 0; index < heads; index++) PyTuple_SET_ITEM(key, index, Py_NewRef(head[index]));
    PyTuple_SET_ITEM(key, heads, dtype);
    PyTuple_SET_ITEM(key, heads + 1, device);
    PyTuple_SET_ITEM(key, heads + 2, layout);
    return key;
}

// Runs plans[key](async_op, tensor) when the plan exists and the tensor is contiguous; no_plan
// otherwise (not a tensor, an unhashable argument, no plan yet, a strided tensor: the Python
// path then validates, plans, stages or refuses the call).
static PyObject *run_planned(PyObject *plans, PyObject *const *head, Py_ssize_t heads, PyObject *tensor,
                             PyObject *async_op, PyObject *no_plan) {
    PyObject *key = plan_key(head, heads, tensor);
    if (key == NULL) {  // not a tensor: the Python path names the argument
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
        PyErr_Clear();
        return Py_NewRef(no_plan);
    }
    PyObject *plan = PyDict_GetItemWithError(plans, key);  // borrowed
    Py_DECREF(key);
    if (plan == NULL) {
        if (PyErr_Occurred()) {  // an unhashable group, tag or reduce op: the Python path refuses it
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear();
        }
        return Py_NewRef(no_plan);
    }
    Py_INCREF(plan);  // a concurrent forget_plans() must not free it under us
    PyObject *contiguous = PyObject_CallMethodNoArgs(tensor, str_is_contiguous);
    PyObject *result = NULL;
    if (contiguous == Py_True) {
        PyObject *run = PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) > 0 ? PyTuple_GET_ITEM(plan, 0) : NULL;
        PyObject *call_args[2] = {async_op, tensor};
        result = run == NULL ? Py_NewRef(no_plan) : PyObject_Vectorcall(run, call_args, 2, NULL);
    } else if (contiguous != NULL) {
        result = Py_NewRef(no_plan);  // staged by the Python path
    }
    Py_XDECREF(contiguous);
    Py_DECREF(plan);
    return result;
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
    PyObject *head[4] = {self->kind, args[2], peer, args[3]};
    return run_planned(self->plans, head, 4, tensor, self->async_op, self->no_plan);
}

// PlannedCollective(plans, kind, int_scalar, no_plan): called as (tensor, scalar, group,
// async_op, extra), it runs the plan of commlayer.dist._planned's key (kind, group, scalar, dtype,
// device, layout) when one exists, extra is None (broadcast's group_src) and the tensor is
// contiguous, and returns no_plan otherwise. The scalar is all_reduce's reduce op or broadcast's
// src, which must then be an int (int_scalar). The Python lookup it replaces cost ~0.4 us.
static PyObject *collective_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames) {
    PlannedP2P *self = (PlannedP2P *)callable;
    if (PyVectorcall_NARGS(nargsf) != 5 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "PlannedCollective: expected (tensor, scalar, group, async_op, extra)");
        return NULL;
    }
    PyObject *scalar = args[1];
    // An int src only: True and 1.0 equal 1 as keys, and they must still be refused.
    if ((self->int_scalar && !PyLong_CheckExact(scalar)) || args[4] != Py_None) return Py_NewRef(self->no_plan);
    PyObject *head[3] = {self->kind, args[2], scalar};
    return run_planned(self->plans, head, 3, args[0], args[3], self->no_plan);
}

static void planned_set(PlannedP2P *self, PyObject *plans, PyObject *kind, PyObject *async_op, PyObject *no_plan) {
    Py_XSETREF(self->plans, Py_NewRef(plans));
    Py_XSETREF(self->kind, Py_NewRef(kind));
    Py_XSETREF(self->async_op, Py_NewRef(async_op));
    Py_XSETREF(self->no_plan, Py_NewRef(no_plan));
}

static int planned_init(PlannedP2P *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"plans", "kind", "async_op", "no_plan", NULL};
    PyObject *plans, *kind, *async_op, *no_plan;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!UO!O", keywords, &PyDict_Type, &plans, &kind, &PyBool_Type,
                                     &async_op, &no_plan)) {
        return -1;
    }
    planned_set(self, plans, kind, async_op, no_plan);
    self->vectorcall = planned_vectorcall;
    return 0;
}

static int collective_init(PlannedP2P *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"plans", "kind", "int_scalar", "no_plan", NULL};
    PyObject *plans, *kind, *no_plan;
    int int_scalar;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!UpO", keywords, &PyDict_Type, &plans, &kind, &int_scalar,
                                     &no_plan)) {
        return -1;
    }
    planned_set(self, plans, kind, Py_None, no_plan);
    self->int_scalar = int_scalar;
    self->vectorcall = collective_vectorcall;
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


PyTypeObject PlannedCollectiveType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commlayer.backends._torch_launcher.PlannedCollective",
    .tp_basicsize = sizeof(PlannedP2P),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PlannedCollective(plans, kind, int_scalar, no_plan)(tensor, scalar, group, async_op, extra): a "
              "planned all_reduce or broadcast, or no_plan.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)collective_init,
    .tp_dealloc = (destructor)planned_dealloc,
    .tp_traverse = (traverseproc)planned_traverse,
    .tp_clear = (inquiry)planned_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PlannedP2P, vectorcall),
};
