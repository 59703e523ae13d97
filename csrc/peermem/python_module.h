// The hot entry points as Python functions (METH_FASTCALL), with none of ctypes' per-argument
// conversions: the same library file is loaded both by ctypes and as the module _peermem_kernels.
#pragma once

static bool want_args(Py_ssize_t nargs, Py_ssize_t n, const char* signature) {
  if (nargs == n) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", signature, n);
  return false;
}

static unsigned long long as_u64(PyObject* o) { return PyLong_AsUnsignedLongLong(o); }

// launch(comm, code, in, out, bytes, blocks, stream, in_slot, out_slot, in_off, out_off, desc)
static PyObject* py_launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!want_args(nargs, 12, "launch(comm, code, in, out, bytes, blocks, stream, in_slot, out_slot, in_off, out_off, desc)"))
    return NULL;
  void* comm = PyLong_AsVoidPtr(args[0]);
  int code = (int)PyLong_AsLong(args[1]);
  void* in = PyLong_AsVoidPtr(args[2]);
  void* out = PyLong_AsVoidPtr(args[3]);
  unsigned long long bytes = as_u64(args[4]);
  int blocks = (int)PyLong_AsLong(args[5]);
  void* stream = PyLong_AsVoidPtr(args[6]);
  int in_slot = (int)PyLong_AsLong(args[7]), out_slot = (int)PyLong_AsLong(args[8]);
  unsigned long long in_off = as_u64(args[9]), out_off = as_u64(args[10]);
  int desc = (int)PyLong_AsLong(args[11]);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(pm_launch(comm, code, in, out, bytes, blocks, stream, in_slot, out_slot, in_off, out_off, desc));
}

// all_to_all(comm, in, out, in_bytes, splits, blocks, stream, in_slot, in_off, desc, push_limit);
// splits: the bytes of 4 * MAX_RANKS unsigned 64-bit integers (send_off, send_len, recv_off,
// recv_len); push_limit: the largest chunk pushed (see all_to_all.cuh).
static PyObject* py_all_to_all(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!want_args(nargs, 11, "all_to_all(comm, in, out, in_bytes, splits, blocks, stream, in_slot, in_off, desc, push_limit)"))
    return NULL;
  void* comm = PyLong_AsVoidPtr(args[0]);
  void* in = PyLong_AsVoidPtr(args[1]);
  void* out = PyLong_AsVoidPtr(args[2]);
  unsigned long long in_bytes = as_u64(args[3]);
  if (!PyBytes_Check(args[4]) || PyBytes_GET_SIZE(args[4]) != (Py_ssize_t)sizeof(Splits)) {
    PyErr_SetString(PyExc_TypeError, "all_to_all: splits must be the bytes of 32 unsigned 64-bit integers");
    return NULL;
  }
  const unsigned long long* splits = (const unsigned long long*)PyBytes_AS_STRING(args[4]);
  int blocks = (int)PyLong_AsLong(args[5]);
  void* stream = PyLong_AsVoidPtr(args[6]);
  int in_slot = (int)PyLong_AsLong(args[7]);
  unsigned long long in_off = as_u64(args[8]);
  int desc = (int)PyLong_AsLong(args[9]);
  unsigned long long push_limit = as_u64(args[10]);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(pm_all_to_all(comm, in, out, in_bytes, splits, blocks, stream, in_slot, in_off, desc, push_limit));
}

// fused_norm(comm, dtype, partial, residual, weight, normed, residual_out, rows, hidden, eps, blocks, stream)
static PyObject* py_fused_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!want_args(nargs, 12, "fused_norm(comm, dtype, partial, residual, weight, normed, residual_out, rows, hidden, eps, blocks, stream)"))
    return NULL;
  void* comm = PyLong_AsVoidPtr(args[0]);
  int dtype = (int)PyLong_AsLong(args[1]);
  void* ptrs[5];
  for (int i = 0; i < 5; ++i) ptrs[i] = PyLong_AsVoidPtr(args[2 + i]);
  int rows = (int)PyLong_AsLong(args[7]), hidden = (int)PyLong_AsLong(args[8]);
  float eps = (float)PyFloat_AsDouble(args[9]);
  int blocks = (int)PyLong_AsLong(args[10]);
  void* stream = PyLong_AsVoidPtr(args[11]);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(pm_fused_norm(comm, dtype, ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], rows, hidden, eps, blocks, stream));
}

// record(event, stream) and wait(stream, event): 0 or a CUDA error code.
static bool two_pointers(PyObject* const* args, Py_ssize_t nargs, const char* signature, void** first, void** second) {
  if (!want_args(nargs, 2, signature)) return false;
  *first = PyLong_AsVoidPtr(args[0]);
  *second = PyLong_AsVoidPtr(args[1]);
  return !PyErr_Occurred();
}

static PyObject* py_record(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  void *event, *stream;
  return two_pointers(args, nargs, "record(event, stream)", &event, &stream) ? PyLong_FromLong(pm_record(event, stream)) : NULL;
}

static PyObject* py_wait(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  void *stream, *event;
  return two_pointers(args, nargs, "wait(stream, event)", &stream, &event) ? PyLong_FromLong(pm_wait(stream, event)) : NULL;
}

// segment(ptr) -> (buffer id, base, size, ipc capable), or an int error code.
static PyObject* py_segment(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!want_args(nargs, 1, "segment(ptr)")) return NULL;
  void* ptr = PyLong_AsVoidPtr(args[0]);
  if (PyErr_Occurred()) return NULL;
  unsigned long long out[4];
  int rc = pm_segment(ptr, out);
  if (rc) return PyLong_FromLong(rc);
  return Py_BuildValue("(KKKO)", out[0], out[1], out[2], out[3] ? Py_True : Py_False);
}

static PyMethodDef kernel_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))py_launch, METH_FASTCALL, "Start one collective kernel."},
    {"all_to_all", (PyCFunction)(void (*)(void))py_all_to_all, METH_FASTCALL, "Start an all_to_all kernel."},
    {"fused_norm", (PyCFunction)(void (*)(void))py_fused_norm, METH_FASTCALL, "Start an all_reduce + residual + RMSNorm."},
    {"segment", (PyCFunction)(void (*)(void))py_segment, METH_FASTCALL, "The allocation holding a device pointer."},
    {"record", (PyCFunction)(void (*)(void))py_record, METH_FASTCALL, "Record an event on a stream."},
    {"wait", (PyCFunction)(void (*)(void))py_wait, METH_FASTCALL, "Make a stream wait for an event."},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef kernel_module = {PyModuleDef_HEAD_INIT, "_peermem_kernels", NULL, -1, kernel_methods};
PyMODINIT_FUNC PyInit__peermem_kernels(void) { return PyModule_Create(&kernel_module); }
