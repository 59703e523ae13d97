// The comms logger's per-plan timer, in C: commlayer.comms_logger._fast_paths.Timed.
//
// commlayer.comms_logger times a blocking op on CPU tensors with two clock reads around the plan
// and one pending entry; in Python that wrapper was ~0.3 us per call on the project VM (a frame,
// two calls to time.perf_counter, the nbytes property, a tuple and the drain check), at the
// issue's 0.3 us limit. Here it is one vectorcall with no frame, and the entry is a record in
// the logger's TimedLog (timed_log.c) with no Python object made. It lives in this extension
// because it is commlayer's one module built on the Python C API alone; it runs any backend's
// plan. The Python wrapper in comms_logger/_timer.py stays the reference and the fallback.
#include "logger_fast_paths.h"

#include "../common/python_module.h"

#include <time.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Py_ssize_t payload, drain_at;
    PyObject *run, *observed, *owner, *label, *log, *drain, *max_events;
} Timed;

static PyObject *str_muted_thread, *str_nbytes;

// What time.perf_counter reads on Linux (CLOCK_MONOTONIC), in nanoseconds: the records line up
// with the logger's other timestamps.
static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static int logs_here(Timed *self, PyObject *async_op) {
    int asynchronous = PyObject_IsTrue(async_op);
    if (asynchronous != 0) return asynchronous < 0 ? -1 : 0;
    PyObject *muted = PyObject_GetAttr(self->owner, str_muted_thread);  // summary()'s own traffic
    if (muted == NULL) return -1;
    int free_to_log = muted == Py_None;
    Py_DECREF(muted);
    return free_to_log;
}

// The tensor's size in bytes: from the tensor meta reader where it reads the tensor, else nbytes.
static long long nbytes_of(PyObject *tensor) {
    CommlayerTensorMeta meta;
    if (tensor_meta_reader != NULL && tensor_meta_reader(tensor, &meta)) {
        return commlayer_tensor_meta_numel(&meta) * meta.itemsize;
    }
    PyObject *nbytes = PyObject_GetAttr(tensor, str_nbytes);
    if (nbytes == NULL) return -1;
    long long value = PyLong_AsLongLong(nbytes);
    Py_DECREF(nbytes);
    return value;
}

// The call entered in the log; the log folded into the logger's records when drain_at are unfolded.
static int record(Timed *self, PyObject *tensor, long long began_ns, long long ended_ns) {
    long long nbytes = nbytes_of(tensor);
    if (nbytes < 0) return PyErr_Occurred() ? -1 : 0;
    timed_log_append(self->log, self->label, nbytes, began_ns, ended_ns);
    if (timed_log_unfolded(self->log) < self->drain_at) return 0;
    PyObject *drained = PyObject_CallOneArg(self->drain, self->max_events);
    Py_XDECREF(drained);
    return drained == NULL ? -1 : 0;
}

// run(async_op, *tensors): an async or muted call goes to the observed run (the logger's
// ordinary path); a blocking one runs the plan between two clock reads and is entered in the log.
static PyObject *timed_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Timed *self = (Timed *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2 + self->payload || kwnames != NULL) {
        PyErr_Format(PyExc_TypeError, "Timed: expected (async_op, tensor, ...), received %zd arguments", nargs);
        return NULL;
    }
    int here = logs_here(self, args[0]);
    if (here <= 0) return here < 0 ? NULL : PyObject_Vectorcall(self->observed, args, nargs, NULL);
    long long began_ns = monotonic_ns();
    PyObject *result = PyObject_Vectorcall(self->run, args, nargs, NULL);
    if (result == NULL) return NULL;
    if (record(self, args[1 + self->payload], began_ns, monotonic_ns()) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    Py_DECREF(result);
    Py_RETURN_NONE;
}

static int timed_init(Timed *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"run", "observed", "owner", "label", "log", "drain", "max_events",
                               "drain_at", "payload", NULL};
    PyObject *fields[7];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO!OOnn", keywords, &fields[0], &fields[1], &fields[2],
                                     &fields[3], &TimedLogType, &fields[4], &fields[5], &fields[6],
                                     &self->drain_at, &self->payload)) {
        return -1;
    }
    // Folded before the ring could overwrite a call not folded yet.
    if (self->payload < 0 || self->drain_at < 1 || self->drain_at > timed_log_capacity(fields[4])) {
        PyErr_SetString(PyExc_ValueError, "Timed: payload >= 0 and 1 <= drain_at <= the log's capacity expected");
        return -1;
    }
    PyObject **slots[7] = {&self->run,     &self->observed, &self->owner,     &self->label,
                           &self->log,     &self->drain,    &self->max_events};
    for (int index = 0; index < 7; index++) Py_XSETREF(*slots[index], Py_NewRef(fields[index]));
    self->vectorcall = timed_vectorcall;
    return 0;
}

#define TIMED_OBJECTS(EACH) EACH(run) EACH(observed) EACH(owner) EACH(label) EACH(log) EACH(drain) EACH(max_events)
COMMLAYER_GC_FIELDS(timed, Timed, TIMED_OBJECTS)

COMMLAYER_GC_DEALLOC(timed, Timed)

PyTypeObject TimedType = {
    COMMLAYER_VECTORCALL_TYPE(
        "commlayer.comms_logger._fast_paths.Timed", Timed, timed_init, timed,
        "Timed(run, observed, owner, label, log, drain, max_events, drain_at, payload)"
        "(async_op, *tensors): the comms logger's timer around a plan."),
};

int timed_init_names(void) {
    str_muted_thread = PyUnicode_InternFromString("_muted_thread");
    str_nbytes = PyUnicode_InternFromString("nbytes");
    return str_muted_thread == NULL || str_nbytes == NULL ? -1 : 0;
}
