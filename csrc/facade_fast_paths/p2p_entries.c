// The C entries of commlayer.dist's isend, irecv, send and recv (P2PEntry).
#include "facade_fast_paths.h"

#include "../common/python_module.h"

// P2PEntry(planned, checked, returns_peer): called as the Python function `checked` is,
// (tensor, peer=None, group=None, tag=0, group_peer=None), it runs the call through its C plan
// lookup (planned, a PlannedP2P) and calls `checked` with the very same arguments when that
// answers no_plan (the facade then validates, plans, stages or refuses the call), or when the
// arguments are not the plain ones this parses (too many, an unknown or repeated keyword: the
// Python function raises as it always did). The Python function's own frame, before it reached
// the same lookup, cost isend ~80 ns of its ~1.6 us on the project VM (2-3x that on the GPU
// hosts). returns_peer: a planned call returns its peer (recv's answer, the sender) instead of
// the plan's result. Instances take a __dict__, so functools.update_wrapper gives them the
// function's name, docstring and signature (__wrapped__).
enum { TENSOR, PEER, GROUP, TAG, GROUP_PEER, PARAMETERS };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *planned, *checked, *dict;
    PyObject *const *names;  // the parameters' names: send_names or recv_names
    int returns_peer;
} P2PEntry;

// Where a keyword goes; -1 for one this entry does not take (the Python function decides).
static int keyword_slot(PyObject *name, PyObject *const *names) {
    for (int slot = TENSOR; slot < PARAMETERS; slot++) {
        if (name == names[slot]) return slot;  // keywords of a call site are interned, as are ours
    }
    return -1;
}

// The call's five arguments, defaults filled in; 0 when they are not plain (see above).
static int parse(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *const *names,
                 PyObject **values) {
    PyObject *defaults[PARAMETERS] = {NULL, Py_None, Py_None, zero, Py_None};
    if (nargs > PARAMETERS) return 0;
    for (int slot = TENSOR; slot < PARAMETERS; slot++) values[slot] = slot < nargs ? args[slot] : defaults[slot];
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t index = 0; index < keywords; index++) {
        int slot = keyword_slot(PyTuple_GET_ITEM(kwnames, index), names);
        if (slot < 0 || slot < nargs) return 0;  // the Python function names the error
        values[slot] = args[nargs + index];
    }
    return values[TENSOR] != NULL;
}

static PyObject *entry_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    P2PEntry *self = (P2PEntry *)callable;
    PyObject *values[PARAMETERS];
    if (parse(args, PyVectorcall_NARGS(nargsf), kwnames, self->names, values)) {
        PyObject *result = planned_p2p(self->planned, values);
        if (result == NULL) return NULL;
        if (result != planned_no_plan(self->planned)) {
            if (!self->returns_peer) return result;
            Py_DECREF(result);
            return Py_NewRef(values[PEER]);
        }
        Py_DECREF(result);
    }
    return PyObject_Vectorcall(self->checked, args, nargsf, kwnames);
}

static int entry_init(P2PEntry *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"planned", "checked", "returns_peer", NULL};
    PyObject *planned, *checked;
    int returns_peer = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O|p", keywords, &PlannedP2PType, &planned, &checked,
                                     &returns_peer)) {
        return -1;
    }
    Py_XSETREF(self->planned, Py_NewRef(planned));
    Py_XSETREF(self->checked, Py_NewRef(checked));
    self->returns_peer = returns_peer;
    self->names = planned_receives(planned) ? recv_names : send_names;
    self->vectorcall = entry_vectorcall;
    return 0;
}

#define ENTRY_OBJECTS(EACH) EACH(planned) EACH(checked) EACH(dict)
COMMLAYER_GC_FIELDS(entry, P2PEntry, ENTRY_OBJECTS)

COMMLAYER_GC_DEALLOC(entry, P2PEntry)

static PyObject *entry_repr(P2PEntry *self) {
    return PyUnicode_FromFormat("<commlayer C entry of %R>", self->checked);
}

static PyGetSetDef entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

PyTypeObject P2PEntryType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.facade.calls._fast_paths.P2PEntry", P2PEntry, entry_init, entry,
        "P2PEntry(planned, checked, returns_peer=False): checked's call, through planned first."),
    .tp_repr = (reprfunc)entry_repr,
    .tp_getset = entry_getset,
    .tp_dictoffset = offsetof(P2PEntry, dict),
};
