// commlayer.core._tensor_meta: a tensor's dtype, device, layout, contiguity and sizes read
// straight from its at::Tensor, for the C fast paths' plan lookups and flight-recorder entries.
//
// Asked through Python, those five are five getter calls (torch's argument parser for
// is_contiguous(), a new torch.device and a new torch.Size each call): ~230 ns of isend's ~540 ns
// of facade on the project VM, and two to three times that on the GPU hosts' CPUs. Here they are
// a few field reads. The price is a build against one torch version's headers: the module
// carries the version it was built for, and commlayer.dist hands its reader to the fast paths
// only when torch's version is that one (commlayer/core/tensor_reader.py; otherwise they ask Python).
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/autograd/python_variable.h>

#include "../common/tensor_meta.h"

#ifndef COMMLAYER_TORCH_VERSION
#error "build with -DCOMMLAYER_TORCH_VERSION=\"<torch.__version__>\" (setup.py does)"
#endif

namespace {

// Whether reading obj's at::Tensor gives what its Python attributes would: a subclass may
// override them, and a torch function mode sees every attribute read.
bool plain(PyObject* obj) {
  return THPVariableClass != nullptr && THPVariable_CheckExact(obj) && !at::impl::torch_function_mode_enabled();
}

int read_meta(PyObject* obj, CommlayerTensorMeta* meta) noexcept {
  if (!plain(obj)) return 0;
  try {
    const at::Tensor& tensor = THPVariable_Unpack(obj);
    if (!tensor.defined() || tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return 0;
    const int64_t dims = tensor.dim();
    if (dims > COMMLAYER_TENSOR_META_DIMS) return 0;
    const c10::Device device = tensor.device();
    meta->scalar_type = static_cast<int8_t>(tensor.scalar_type());
    meta->device_type = static_cast<int8_t>(device.type());
    meta->device_index = device.index();
    meta->layout = static_cast<int8_t>(tensor.layout());
    meta->itemsize = static_cast<int8_t>(tensor.element_size());
    // Only strided tensors have strides; torch's is_contiguous() raises for the others.
    meta->contiguous = tensor.layout() == c10::kStrided && tensor.is_contiguous();
    meta->dim = static_cast<int16_t>(dims);
    const c10::IntArrayRef sizes = tensor.sizes();
    for (int64_t index = 0; index < dims; index++) meta->sizes[index] = sizes[index];
    meta->data = tensor.has_storage() ? reinterpret_cast<uintptr_t>(tensor.const_data_ptr()) : 0;
    return 1;
  } catch (...) {  // a tensor whose C++ side refuses a read (e.g. custom sizes): Python decides
    return 0;
  }
}

// describe(tensor): (scalar_type, device_type, device_index, layout, contiguous, sizes, itemsize, data) as the
// fast paths see it, or None where they ask Python instead. For tests.
PyObject* describe(PyObject*, PyObject* tensor) {
  CommlayerTensorMeta meta;
  if (!read_meta(tensor, &meta)) Py_RETURN_NONE;
  PyObject* sizes = PyTuple_New(meta.dim);
  if (sizes == nullptr) return nullptr;
  for (int index = 0; index < meta.dim; index++) {
    PyObject* size = PyLong_FromLongLong(meta.sizes[index]);
    if (size == nullptr) {
      Py_DECREF(sizes);
      return nullptr;
    }
    PyTuple_SET_ITEM(sizes, index, size);
  }
  return Py_BuildValue("(iiiiONiK)", meta.scalar_type, meta.device_type, meta.device_index, meta.layout,
                       meta.contiguous ? Py_True : Py_False, sizes, meta.itemsize,
                       static_cast<unsigned long long>(meta.data));
}

PyMethodDef methods[] = {
    {"describe", describe, METH_O, "describe(tensor): what the C fast paths read of it, or None."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_tensor_meta", "A tensor's metadata for commlayer's C fast paths.", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__tensor_meta() {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  PyObject* reader = PyCapsule_New(reinterpret_cast<void*>(&read_meta), COMMLAYER_TENSOR_META_CAPSULE, nullptr);
  if (reader == nullptr || PyModule_AddObject(module, "READER", reader) < 0 ||
      PyModule_AddStringConstant(module, "BUILT_FOR", COMMLAYER_TORCH_VERSION) < 0) {
    Py_XDECREF(reader);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
