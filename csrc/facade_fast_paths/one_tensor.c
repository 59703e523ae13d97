// The planned lookups of commlayer.facade.calls._fast_paths: point-to-point (PlannedP2P) and the
// one-tensor collectives (PlannedCollective: all_reduce, broadcast).
#include "facade_fast_paths.h"

#include "../common/python_module.h"

// PlannedP2P(plans, kind, async_op, no_plan): called as (tensor, peer, group, tag, group_peer),
// it runs the plan of commlayer.facade.ops.p2p's key (kind, group, peer, tag, dtype, device, layout)
// when one exists, the peer is an int, group_peer is None and the tensor is contiguous, and
// returns no_plan otherwise (the Python path then validates, plans or refuses the call). The
// Python lookup it replaces cost isend ~0.45 us of its ~0.8 us on the project VM.
// The key and plan of the last call that ran a plan (an inline cache). Building the key tuple,
// hashing it and probing plans cost ~70 ns of the lookup's ~290 on the project VM; comparing the
// call's arguments with the last hit's costs a few identity checks. The hit stands only while
// plans' version tag is the one it was found at: any change to plans (a plan added, forget_plans'
// clear, a test's plans.clear()) moves the tag, and the next call looks up again. While the tag
// holds, plans still maps this key to this plan, so the borrowed plan is alive; the group is held
// weakly (a destroyed group must not be kept alive by a cache), the rest (ints, a reduce op, a
// dtype, a device, a layout) strongly.
#define HEAD_SCALARS 2
typedef struct {
    uint64_t version;  // plans' version tag when found; meaningful only while plan != NULL
    PyObject *plan;    // borrowed (see above)
    PyObject *group;   // a weak reference to the group argument, or None
    PyObject *scalars[HEAD_SCALARS], *dtype, *device, *layout;
    // The same dtype, device and layout as the tensor meta reader gives them, when it read the
    // tensor (has_meta): a plain tensor's call is then compared without any Python attribute.
    int has_meta;
    CommlayerTensorMeta meta;
} LastHit;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *plans, *kind, *async_op, *no_plan;
    int int_scalar;  // PlannedCollective: the scalar must be an int (a root), not merely equal one
    LastHit hit;
} PlannedP2P;

// Dict version tags (PEP 509): on CPython 3.11-3.13 every change to a dict gives it a new tag.
// Elsewhere, or should the module's self-check find otherwise (dict_versions_usable), no call is
// answered from the cache.
int dict_versions_usable;

uint64_t dict_version(PyObject *dict) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return ((PyDictObject *)dict)->ma_version_tag;
#pragma GCC diagnostic pop
#else
    (void)dict;
    return 0;
#endif
}

int check_dict_versions(void) {
    PyObject *dict = PyDict_New();
    if (dict == NULL) return -1;
    uint64_t created = dict_version(dict);
    int stored = PyDict_SetItem(dict, Py_None, Py_None);
    uint64_t added = dict_version(dict);
    PyDict_Clear(dict);
    uint64_t cleared = dict_version(dict);
    Py_DECREF(dict);
    if (stored < 0) return -1;
    dict_versions_usable = created != added && added != cleared && cleared != created;
    return 0;
}

static void forget_hit(LastHit *hit) {
    hit->plan = NULL;
    hit->has_meta = 0;
    Py_CLEAR(hit->group);
    for (int index = 0; index < HEAD_SCALARS; index++) Py_CLEAR(hit->scalars[index]);
    Py_CLEAR(hit->dtype);
    Py_CLEAR(hit->device);
    Py_CLEAR(hit->layout);
}

static int same(PyObject *held, PyObject *given) {
    if (held == given) return 1;
    int equal = PyObject_RichCompareBool(held, given, Py_EQ);
    if (equal < 0) PyErr_Clear();  // not a hit: the dict lookup decides
    return equal > 0;
}

int same_group(PyObject *held, PyObject *group) {
    if (held == Py_None || group == Py_None) return held == group;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return PyWeakref_GetObject(held) == group;
#pragma GCC diagnostic pop
}

PyObject *held_weakly(PyObject *group) {
    if (group == Py_None) return Py_NewRef(Py_None);
    PyObject *weak = PyWeakref_NewRef(group, NULL);
    if (weak == NULL) PyErr_Clear();  // a group that takes no weak reference: always looked up
    return weak;
}

// Whether the last hit stands and was for head = (kind, group, scalars...).
static int same_head(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads) {
    LastHit *hit = &self->hit;
    if (hit->plan == NULL || hit->version != dict_version(self->plans) || !same_group(hit->group, head[1])) {
        return 0;
    }
    for (Py_ssize_t index = 2; index < heads; index++) {
        if (!same(hit->scalars[index - 2], head[index])) return 0;
    }
    return 1;
}

// attributes = (dtype, device, layout) of the tensor.
static PyObject *cached_plan(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads, PyObject *const *attributes) {
    LastHit *hit = &self->hit;
    if (!same_head(self, head, heads) || !same(hit->dtype, attributes[0]) || !same(hit->device, attributes[1]) ||
        !same(hit->layout, attributes[2])) {
        return NULL;
    }
    return hit->plan;
}

// The same for a tensor the meta reader read.
static PyObject *cached_plan_by_meta(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads,
                                     const CommlayerTensorMeta *meta) {
    const LastHit *hit = &self->hit;
    if (!hit->has_meta || !commlayer_tensor_meta_same_kind(&hit->meta, meta)) return NULL;
    return same_head(self, head, heads) ? hit->plan : NULL;
}

static void remember_hit(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads, PyObject *const *attributes,
                         const CommlayerTensorMeta *meta, PyObject *plan) {
    LastHit *hit = &self->hit;
    forget_hit(hit);
    if (!dict_versions_usable || heads - 2 > HEAD_SCALARS) return;
    hit->group = held_weakly(head[1]);
    if (hit->group == NULL) return;
    for (Py_ssize_t index = 2; index < heads; index++) hit->scalars[index - 2] = Py_NewRef(head[index]);
    hit->dtype = Py_NewRef(attributes[0]);
    hit->device = Py_NewRef(attributes[1]);
    hit->layout = Py_NewRef(attributes[2]);
    hit->has_meta = meta != NULL;
    if (meta != NULL) hit->meta = *meta;
    hit->version = dict_version(self->plans);
    hit->plan = plan;
}

// (tensor.dtype, tensor.device, tensor.layout) into attributes (new references); -1 with an
// exception set (AttributeError: not a tensor).
int tensor_attributes(PyObject *tensor, PyObject **attributes) {
    attributes[0] = PyObject_GetAttr(tensor, str_dtype);
    attributes[1] = attributes[0] == NULL ? NULL : PyObject_GetAttr(tensor, str_device);
    attributes[2] = attributes[1] == NULL ? NULL : PyObject_GetAttr(tensor, str_layout);
    if (attributes[2] != NULL) return 0;
    Py_XDECREF(attributes[0]);
    Py_XDECREF(attributes[1]);
    return -1;
}

// plans[(head..., dtype, device, layout)] (borrowed), NULL when missing or on an error (set).
static PyObject *looked_up(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads, PyObject *const *attributes,
                           const CommlayerTensorMeta *meta) {
    PyObject *key = PyTuple_New(heads + 3);
    if (key == NULL) return NULL;
    for (Py_ssize_t index = 0; index < heads; index++) PyTuple_SET_ITEM(key, index, Py_NewRef(head[index]));
    for (Py_ssize_t index = 0; index < 3; index++) PyTuple_SET_ITEM(key, heads + index, Py_NewRef(attributes[index]));
    PyObject *plan = PyDict_GetItemWithError(self->plans, key);  // borrowed
    Py_DECREF(key);
    if (plan != NULL) remember_hit(self, head, heads, attributes, meta, plan);
    return plan;
}

// The plan of (head..., tensor.dtype, tensor.device, tensor.layout), borrowed; NULL when there is
// none, with an exception set only for an error the Python path must not see. meta: what the
// meta reader read of the tensor, or NULL (then the tensor's Python attributes are asked).
static PyObject *plan_of(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads, PyObject *tensor,
                         const CommlayerTensorMeta *meta) {
    PyObject *plan = meta == NULL ? NULL : cached_plan_by_meta(self, head, heads, meta);
    if (plan != NULL) return plan;
    PyObject *attributes[3];
    if (tensor_attributes(tensor, attributes) < 0) {  // not a tensor: the Python path names the argument
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
        return NULL;
    }
    plan = cached_plan(self, head, heads, attributes);
    if (plan == NULL) plan = looked_up(self, head, heads, attributes, meta);
    for (int index = 0; index < 3; index++) Py_DECREF(attributes[index]);
    // An unhashable group, tag or reduce op: the Python path refuses it.
    if (plan == NULL && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear();
    return plan;
}

// Whether tensor is contiguous (-1 with an exception set), from meta where the reader read it.
static int contiguous(PyObject *tensor, const CommlayerTensorMeta *meta) {
    if (meta != NULL) return meta->contiguous;
    PyObject *answer = PyObject_CallMethodNoArgs(tensor, str_is_contiguous);
    if (answer == NULL) return -1;
    int truth = answer == Py_True;
    Py_DECREF(answer);
    return truth;
}

// Runs plans[key](async_op, tensor) for the key (head..., tensor.dtype, tensor.device,
// tensor.layout) when the plan exists and the tensor is contiguous; no_plan otherwise (not a
// tensor, an unhashable argument, no plan yet, a strided tensor: the Python path then validates,
// plans, stages or refuses the call).
static PyObject *run_planned(PlannedP2P *self, PyObject *const *head, Py_ssize_t heads, PyObject *tensor,
                             PyObject *async_op) {
    CommlayerTensorMeta read;
    const CommlayerTensorMeta *meta = tensor_meta_reader != NULL && tensor_meta_reader(tensor, &read) ? &read : NULL;
    PyObject *plan = plan_of(self, head, heads, tensor, meta);
    if (plan == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(self->no_plan);
    Py_INCREF(plan);  // a concurrent forget_plans() must not free it under us
    int is_contiguous = contiguous(tensor, meta);
    PyObject *result = NULL;
    if (is_contiguous > 0) {
        PyObject *run = PyTuple_Check(plan) && PyTuple_GET_SIZE(plan) > 0 ? PyTuple_GET_ITEM(plan, 0) : NULL;
        PyObject *call_args[2] = {async_op, tensor};
        result = run == NULL ? Py_NewRef(self->no_plan) : PyObject_Vectorcall(run, call_args, 2, NULL);
    } else if (is_contiguous == 0) {
        result = Py_NewRef(self->no_plan);  // staged by the Python path
    }
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
    return run_planned(self, head, 4, tensor, self->async_op);
}

PyObject *planned_p2p(PyObject *planned, PyObject *const *args) {
    return planned_vectorcall(planned, args, 5, NULL);
}

PyObject *planned_no_plan(PyObject *planned) {
    return ((PlannedP2P *)planned)->no_plan;
}

int planned_receives(PyObject *planned) {
    return PyUnicode_CompareWithASCIIString(((PlannedP2P *)planned)->kind, "recv") == 0;
}

// PlannedCollective(plans, kind, int_scalar, no_plan): called as (tensor, scalar, group,
// async_op, extra), it runs the plan of commlayer.facade.ops.in_place's key (kind, group, scalar, dtype,
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
    return run_planned(self, head, 3, args[0], args[3]);
}

static void planned_set(PlannedP2P *self, PyObject *plans, PyObject *kind, PyObject *async_op, PyObject *no_plan) {
    forget_hit(&self->hit);
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

#define PLANNED_OBJECTS(EACH) EACH(plans) EACH(kind) EACH(async_op) EACH(no_plan)

static int planned_traverse(PlannedP2P *self, visitproc visit, void *arg) {
    PLANNED_OBJECTS(COMMLAYER_VISIT_FIELD)
    Py_VISIT(self->hit.group);
    for (int index = 0; index < HEAD_SCALARS; index++) Py_VISIT(self->hit.scalars[index]);
    Py_VISIT(self->hit.dtype);
    Py_VISIT(self->hit.device);
    Py_VISIT(self->hit.layout);
    return 0;
}

static int planned_clear(PlannedP2P *self) {
    PLANNED_OBJECTS(COMMLAYER_CLEAR_FIELD)
    forget_hit(&self->hit);
    return 0;
}

COMMLAYER_GC_DEALLOC(planned, PlannedP2P)

PyTypeObject PlannedP2PType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.facade.calls._fast_paths.PlannedP2P", PlannedP2P, planned_init, planned,
        "PlannedP2P(plans, kind, async_op, no_plan)(tensor, peer, group, tag, group_peer): a planned "
        "send or recv, or no_plan."),
};


PyTypeObject PlannedCollectiveType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.facade.calls._fast_paths.PlannedCollective", PlannedP2P, collective_init, planned,
        "PlannedCollective(plans, kind, int_scalar, no_plan)(tensor, scalar, group, async_op, extra): a "
        "planned all_reduce or broadcast, or no_plan."),
};
