// The op schemas. Kernels register themselves per dispatch key in the .cu files;
// the CPU, Meta and autograd pieces are registered from vga_linear/ops.py.
#include <Python.h>
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(vga, m) {
  m.def("gather_concat_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  m.def("gather_concat_linear_grad_x(Tensor grad_out, Tensor weight, int num_shards, Tensor? x=None) -> Tensor");
  m.def("gather_concat_linear_grad_weight(Tensor grad_out, Tensor x) -> Tensor");
  // Both products of one backward (what autograd calls when x and weight both need a gradient).
  m.def("gather_concat_linear_backward(Tensor grad_out, Tensor x, Tensor weight) -> (Tensor grad_x, Tensor grad_weight)");
  // Private: run one named kernel family (tests, benchmarks; "sm90_gemm/n128/s4" forces a configuration
  // of the GEMM core), name the one auto-dispatch picks (or what a forced name resolves to) with its
  // configuration, and the cluster counts the GEMM core's plan uses.
  m.def("_gather_concat_linear_family(Tensor x, Tensor weight, Tensor? bias, str family) -> Tensor");
  m.def("_gather_concat_linear_choice(Tensor x, Tensor weight, Tensor? bias, str family=\"\") -> str");
  m.def("_sm90_resident_clusters(Tensor x) -> str");
  m.def(
      "_gather_concat_linear_grad_x_family(Tensor grad_out, Tensor weight, int num_shards, str family, "
      "Tensor? x=None) -> Tensor");
  m.def("_gather_concat_linear_grad_weight_family(Tensor grad_out, Tensor x, str family) -> Tensor");
  m.def(
      "_gather_concat_linear_backward_family(Tensor grad_out, Tensor x, Tensor weight, str grad_x_family, "
      "str grad_weight_family) -> (Tensor grad_x, Tensor grad_weight)");
}

// `import vga_linear._C` loads this library (and so runs the registrations above);
// the module itself is empty, which keeps it within the limited (abi3) Python API.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
