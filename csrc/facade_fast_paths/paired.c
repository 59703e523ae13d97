// The planned lookup of the two-tensor collectives of commlayer.facade.calls._fast_paths:
// PlannedPaired (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single).
#include "facade_fast_paths.h"

#include "../common/python_module.h"

// PlannedPaired(plans, kind, relation, no_plan): called as (output, input, group, async_op,
// scalar, extra), it runs the plan of commlayer.facade.ops.in_place's key (kind, group, [scalar,]
// output's dtype, device, layout, input's dtype, device, layout) when the tensor meta reader
// reads both tensors, both are contiguous and their element counts fit the plan (relation), and
// returns no_plan otherwise; the Python lookup then tries (it also takes what the reader does not
// read: subclasses, a torch function mode). The scalar is reduce_scatter's reduce op (in the
// key); all_gather passes None for both, all_to_all_single its two split lists, which must be
// None. The Python lookup it replaces cost ~0.6 us (eight attributes, a key, two contiguity
// calls) on the project VM.
enum Relation { GATHERS = 0, SCATTERS = 1, EXCHANGES = 2 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *plans, *kind, *no_plan;
    int relation;
    // The last call that ran a plan (an inline cache, as one_tensor.c's; the plan borrowed while
    // plans' version tag is unchanged, the group held weakly).
    uint64_t version;
    PyObject *plan, *group, *scalar;
    CommlayerTensorMeta output, input;
} PlannedPaired;

static void forget(PlannedPaired *self) {
    self->plan = NULL;
    Py_CLEAR(self->group);
    Py_CLEAR(self->scalar);
}

static PyObject *cached(PlannedPaired *self, PyObject *group, PyObject *scalar, const CommlayerTensorMeta *metas) {
    if (self->plan == NULL || self->version != dict_version(self->plans) || !same_group(self->group, group) ||
        self->scalar != scalar || !commlayer_tensor_meta_same_kind(&self->output, &metas[0]) ||
        !commlayer_tensor_meta_same_kind(&self->input, &metas[1])) {
        return NULL;
    }
    return self->plan;
}

static void remember(PlannedPaired *self, PyObject *group, PyObject *scalar, const CommlayerTensorMeta *metas,
                     PyObject *plan) {
    forget(self);
    if (!dict_versions_usable) return;
    self->group = held_weakly(group);
    if (self->group == NULL) return;
    self->scalar = Py_NewRef(scalar);
    self->output = metas[0];
    self->input = metas[1];
    self->version = dict_version(self->plans);
    self->plan = plan;
}

// plans[key] (borrowed) or NULL (no plan; an unhashable argument's error cleared).
static PyObject *looked_up(PlannedPaired *self, PyObject *const *tensors, PyObject *group, PyObject *scalar) {
    PyObject *attributes[6];
    if (tensor_attributes(tensors[0], attributes) < 0) return NULL;
    if (tensor_attributes(tensors[1], attributes + 3) < 0) {
        for (int index = 0; index < 3; index++) Py_DECREF(attributes[index]);
        return NULL;
    }
    int scalars = scalar == Py_None ? 0 : 1;
    PyObject *key = PyTuple_New(2 + scalars + 6);
    if (key != NULL) {
        PyTuple_SET_ITEM(key, 0, Py_NewRef(self->kind));
        PyTuple_SET_ITEM(key, 1, Py_NewRef(group));
        if (scalars) PyTuple_SET_ITEM(key, 2, Py_NewRef(scalar));
        for (int index = 0; index < 6; index++) {
            PyTuple_SET_ITEM(key, 2 + scalars + index, Py_NewRef(attributes[index]));
        }
    }
    for (int index = 0; index < 6; index++) Py_DECREF(attributes[index]);
    PyObject *plan = key == NULL ? NULL : PyDict_GetItemWithError(self->plans, key);
    Py_XDECREF(key);
    return plan;
}

// Whether the two tensors' element counts fit a group of size (what the key cannot hold).
static int counts_fit(int relation, const CommlayerTensorMeta *metas, long long size) {
    const CommlayerTensorMeta *output = &metas[0], *input = &metas[1];
    if (relation == GATHERS) return commlayer_tensor_meta_numel(output) == size * commlayer_tensor_meta_numel(input);
    if (relation == SCATTERS) return commlayer_tensor_meta_numel(input) == size * commlayer_tensor_meta_numel(output);
    // EXCHANGES: even splits of dim 0 (0-d tensors take the Python path)
    return output->dim > 0 && input->dim > 0 && output->sizes[0] % size == 0 && input->sizes[0] % size == 0;
}

static PyObject *run_plan(PlannedPaired *self, PyObject *plan, PyObject *const *tensors, PyObject *async_op,
                          const CommlayerTensorMeta *metas) {
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) < 3) return Py_NewRef(self->no_plan);
    long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(plan, 2));
    if (size < 1 || !counts_fit(self->relation, metas, size)) {
        PyErr_Clear();
        return Py_NewRef(self->no_plan);
    }
    PyObject *call_args[5] = {async_op, tensors[0], tensors[1], Py_None, Py_None};
    Py_ssize_t count = self->relation == EXCHANGES ? 5 : 3;
    return PyObject_Vectorcall(PyTuple_GET_ITEM(plan, 0), call_args, count, NULL);
}

static PyObject *paired_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PlannedPaired *self = (PlannedPaired *)callable;
    if (PyVectorcall_NARGS(nargsf) != 6 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "PlannedPaired: expected (output, input, group, async_op, scalar, extra)");
        return NULL;
    }
    PyObject *group = args[2], *async_op = args[3], *scalar = args[4];
    CommlayerTensorMeta metas[2];
    if (tensor_meta_reader == NULL || !tensor_meta_reader(args[0], &metas[0]) ||
        !tensor_meta_reader(args[1], &metas[1]) || !metas[0].contiguous || !metas[1].contiguous || args[5] != Py_None ||
        (self->relation == EXCHANGES && scalar != Py_None)) {
        return Py_NewRef(self->no_plan);
    }
    PyObject *plan = cached(self, group, scalar, metas);
    if (plan == NULL) {
        plan = looked_up(self, args, group, scalar);
        if (plan == NULL) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear();  // no plan, or an unhashable argument: the Python path decides
            return Py_NewRef(self->no_plan);
        }
        remember(self, group, scalar, metas, plan);
    }
    Py_INCREF(plan);  // a concurrent forget_plans() must not free it under us
    PyObject *result = run_plan(self, plan, args, async_op, metas);
    Py_DECREF(plan);
    return result;
}

static int paired_init(PlannedPaired *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"plans", "kind", "relation", "no_plan", NULL};
    PyObject *plans, *kind, *no_plan;
    int relation;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!UiO", keywords, &PyDict_Type, &plans, &kind, &relation,
                                     &no_plan)) {
        return -1;
    }
    if (relation < GATHERS || relation > EXCHANGES) {
        PyErr_SetString(PyExc_ValueError, "PlannedPaired: relation 0 (gathers), 1 (scatters) or 2 (exchanges)");
        return -1;
    }
    forget(self);
    Py_XSETREF(self->plans, Py_NewRef(plans));
    Py_XSETREF(self->kind, Py_NewRef(kind));
    Py_XSETREF(self->no_plan, Py_NewRef(no_plan));
    self->relation = relation;
    self->vectorcall = paired_vectorcall;
    return 0;
}

#define PAIRED_OBJECTS(EACH) EACH(plans) EACH(kind) EACH(no_plan)

static int paired_traverse(PlannedPaired *self, visitproc visit, void *arg) {
    PAIRED_OBJECTS(COMMLAYER_VISIT_FIELD)
    Py_VISIT(self->group);
    Py_VISIT(self->scalar);
    return 0;
}

static int paired_clear(PlannedPaired *self) {
    forget(self);  // the cached call: group and scalar
    PAIRED_OBJECTS(COMMLAYER_CLEAR_FIELD)
    return 0;
}

COMMLAYER_GC_DEALLOC(paired, PlannedPaired)

PyTypeObject PlannedPairedType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.facade.calls._fast_paths.PlannedPaired", PlannedPaired, paired_init, paired,
        "PlannedPaired(plans, kind, relation, no_plan)(output, input, group, async_op, scalar, extra): "
        "a planned two-tensor collective, or no_plan."),
};
