// The comms logger's record of timed calls, in C: commlayer.comms_logger._fast_paths.TimedLog.
//
// The C timer (timed.c) used to append a tuple (label, nbytes, began, ended) per blocking call to
// a Python list, which the logger folded into its totals 4096 at a time: the tuple, its two
// floats and the fold cost ~0.35 us a call on the project VM, more than the 0.3 us for
// the whole logger. Here a call is four stores into a ring of plain records. fold() hands the
// logger one aggregate per (label, nbytes) of the calls not folded yet; events() builds the trace's
// tuples only when a trace is asked for. The ring keeps the most recent `capacity` calls for the
// trace; the timer folds before any unfolded call can be overwritten (drain_at <= capacity).
#include "logger_fast_paths.h"

typedef struct {
    PyObject *label;  // strong; NULL in a slot never written
    long long nbytes, began_ns, ended_ns;
} TimedRecord;

typedef struct {
    PyObject_HEAD
    TimedRecord *records;
    Py_ssize_t capacity;
    unsigned long long written, folded, cleared;  // calls written ever; folded; written at clear()
} TimedLog;

void timed_log_append(PyObject *log, PyObject *label, long long nbytes, long long began_ns, long long ended_ns) {
    TimedLog *self = (TimedLog *)log;
    TimedRecord *record = &self->records[self->written % (unsigned long long)self->capacity];
    Py_INCREF(label);
    Py_XSETREF(record->label, label);
    record->nbytes = nbytes;
    record->began_ns = began_ns;
    record->ended_ns = ended_ns;
    self->written++;
}

Py_ssize_t timed_log_unfolded(PyObject *log) {
    return (Py_ssize_t)(((TimedLog *)log)->written - ((TimedLog *)log)->folded);
}

Py_ssize_t timed_log_capacity(PyObject *log) {
    return ((TimedLog *)log)->capacity;
}

static int timed_log_init(TimedLog *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"capacity", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", keywords, &capacity)) return -1;
    if (capacity < 1 || self->records != NULL) {
        PyErr_SetString(PyExc_ValueError, "TimedLog: a capacity >= 1 expected, given once");
        return -1;
    }
    self->records = PyMem_Calloc((size_t)capacity, sizeof(TimedRecord));
    if (self->records == NULL) return PyErr_NoMemory(), -1;
    self->capacity = capacity;
    return 0;
}

// One (label, nbytes) group of fold(): count, total, min and max of its durations in seconds.
typedef struct {
    PyObject *label;
    long long nbytes, count, total_ns, min_ns, max_ns;
} Group;

static PyObject *group_tuple(const Group *group) {
    return Py_BuildValue("(OLLddd)", group->label, group->nbytes, group->count, group->total_ns / 1e9,
                         group->min_ns / 1e9, group->max_ns / 1e9);
}

// Into groups (growing it), the call at record; the index of its group. Consecutive calls are
// mostly of one plan, so the last group found is tried first.
static Py_ssize_t add_to_group(Group **groups, Py_ssize_t *count, Py_ssize_t *room, Py_ssize_t last,
                               const TimedRecord *record) {
    long long seconds_ns = record->ended_ns - record->began_ns;
    Py_ssize_t index = last;
    if (index < 0 || (*groups)[index].label != record->label || (*groups)[index].nbytes != record->nbytes) {
        for (index = 0; index < *count; index++) {
            if ((*groups)[index].label == record->label && (*groups)[index].nbytes == record->nbytes) break;
        }
    }
    if (index == *count) {
        if (*count == *room) {
            Group *grown = PyMem_Realloc(*groups, sizeof(Group) * (size_t)(*room * 2));
            if (grown == NULL) return -1;
            *groups = grown;
            *room *= 2;
        }
        (*groups)[index] = (Group){record->label, record->nbytes, 0, 0, seconds_ns, seconds_ns};
        (*count)++;
    }
    Group *group = &(*groups)[index];
    group->count++;
    group->total_ns += seconds_ns;
    if (seconds_ns < group->min_ns) group->min_ns = seconds_ns;
    if (seconds_ns > group->max_ns) group->max_ns = seconds_ns;
    return index;
}

// The first call the ring still holds since the last clear().
static unsigned long long first_kept(const TimedLog *self) {
    unsigned long long oldest = self->written > (unsigned long long)self->capacity ? self->written - self->capacity : 0;
    return oldest > self->cleared ? oldest : self->cleared;
}

// fold(): [(label, nbytes, count, total_s, min_s, max_s)] of the calls written since the last fold.
static PyObject *timed_log_fold(TimedLog *self, PyObject *unused) {
    (void)unused;
    Py_ssize_t count = 0, room = 8, last = -1;
    Group *groups = PyMem_Malloc(sizeof(Group) * (size_t)room);
    if (groups == NULL) return PyErr_NoMemory();
    unsigned long long first = self->folded > first_kept(self) ? self->folded : first_kept(self);  // never lapped
    for (unsigned long long call = first; call < self->written; call++) {
        last = add_to_group(&groups, &count, &room, last, &self->records[call % (unsigned long long)self->capacity]);
        if (last < 0) {
            PyMem_Free(groups);
            return PyErr_NoMemory();
        }
    }
    PyObject *folded = PyList_New(count);
    for (Py_ssize_t index = 0; folded != NULL && index < count; index++) {
        PyObject *item = group_tuple(&groups[index]);
        if (item == NULL) Py_CLEAR(folded);
        else PyList_SET_ITEM(folded, index, item);
    }
    PyMem_Free(groups);
    if (folded != NULL) self->folded = self->written;
    return folded;
}

// events(): [(label, nbytes, began_s, ended_s)] of the calls the ring holds, oldest first.
static PyObject *timed_log_events(TimedLog *self, PyObject *unused) {
    (void)unused;
    unsigned long long first = first_kept(self);
    PyObject *events = PyList_New((Py_ssize_t)(self->written - first));
    for (unsigned long long call = first; events != NULL && call < self->written; call++) {
        const TimedRecord *record = &self->records[call % (unsigned long long)self->capacity];
        PyObject *event = Py_BuildValue("(OLdd)", record->label, record->nbytes, record->began_ns / 1e9,
                                        record->ended_ns / 1e9);
        if (event == NULL) Py_CLEAR(events);
        else PyList_SET_ITEM(events, (Py_ssize_t)(call - first), event);
    }
    return events;
}

// dropped(): calls since the last clear() that the ring no longer holds.
static PyObject *timed_log_dropped(TimedLog *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromUnsignedLongLong(first_kept(self) - self->cleared);
}

// clear(): forget every call (folded or not), as the logger's reset() does its records.
static PyObject *timed_log_clear(TimedLog *self, PyObject *unused) {
    (void)unused;
    self->cleared = self->folded = self->written;
    Py_RETURN_NONE;
}

static PyObject *timed_log_get_unfolded(TimedLog *self, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(timed_log_unfolded((PyObject *)self));
}

static int timed_log_traverse(TimedLog *self, visitproc visit, void *arg) {
    for (Py_ssize_t index = 0; self->records != NULL && index < self->capacity; index++) {
        Py_VISIT(self->records[index].label);
    }
    return 0;
}

static int timed_log_clear_references(TimedLog *self) {
    for (Py_ssize_t index = 0; self->records != NULL && index < self->capacity; index++) {
        Py_CLEAR(self->records[index].label);
    }
    return 0;
}

static void timed_log_dealloc(TimedLog *self) {
    PyObject_GC_UnTrack(self);
    timed_log_clear_references(self);
    PyMem_Free(self->records);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef timed_log_methods[] = {
    {"fold", (PyCFunction)timed_log_fold, METH_NOARGS,
     "fold(): [(label, nbytes, count, total_s, min_s, max_s)] of the calls since the last fold"},
    {"events", (PyCFunction)timed_log_events, METH_NOARGS,
     "events(): [(label, nbytes, began_s, ended_s)] of the calls kept, oldest first"},
    {"dropped", (PyCFunction)timed_log_dropped, METH_NOARGS, "dropped(): calls no longer kept"},
    {"clear", (PyCFunction)timed_log_clear, METH_NOARGS, "clear(): forget every call"},
    {NULL},
};

static PyGetSetDef timed_log_getset[] = {
    {"unfolded", (getter)timed_log_get_unfolded, NULL, "calls written since the last fold", NULL},
    {NULL},
};

static PyMemberDef timed_log_members[] = {
    {"capacity", T_PYSSIZET, offsetof(TimedLog, capacity), READONLY, "calls the ring keeps"},
    {NULL},
};

PyTypeObject TimedLogType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "commlayer.comms_logger._fast_paths.TimedLog",
    .tp_basicsize = sizeof(TimedLog),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "TimedLog(capacity): the C timer's record of blocking calls (a ring of the most recent).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)timed_log_init,
    .tp_dealloc = (destructor)timed_log_dealloc,
    .tp_traverse = (traverseproc)timed_log_traverse,
    .tp_clear = (inquiry)timed_log_clear_references,
    .tp_methods = timed_log_methods,
    .tp_getset = timed_log_getset,
    .tp_members = timed_log_members,
};
