// Reads attrs from MindSpore's AotExtra, the `extra` argument of an AOT kernel.
//
// Compiled alone with -D_GLIBCXX_USE_CXX11_ABI=0: MindSpore 2.x is built with the old
// std::string ABI and AotExtra's getters take and return std::string by value, so they must be
// called from code of that ABI. Only C types cross this file's boundary. The class below
// mirrors the layout of MindSpore's AotExtra (custom_aot_extra.h, which cannot be included:
// it pulls in MindSpore internals); the order of its virtual functions is its vtable. Importing
// opforge.mindspore checks the installed header's members against this order (its
// _AOT_EXTRA_LAYOUT: keep the two the same).
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

// A named namespace, not an anonymous one: in an anonymous namespace the compiler knows no class
// derives from AotExtra and turns the calls into calls of its pure virtual functions.
namespace opforge_mirror {

class AotKernelData {
 public:
  virtual ~AotKernelData() = default;
};

class AotExtra {
 public:
  virtual ~AotExtra() = default;
  virtual bool HasAttr(std::string name) = 0;
  std::string Str(const std::string& name) { return GetAttrStr(name); }

 private:
  virtual bool GetAttrBool(std::string name) = 0;
  virtual int64_t GetAttrInt(std::string name) = 0;
  virtual float GetAttrFloat(std::string name) = 0;
  virtual std::string GetAttrStr(std::string name) = 0;
  virtual std::vector<int64_t> GetAttrIntVec(std::string name) = 0;
  virtual std::vector<float> GetAttrFloatVec(std::string name) = 0;
  virtual std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) = 0;
  virtual std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) = 0;
  std::vector<size_t> workspace_;
  AotKernelData* kernel_data_{nullptr};
};

// What opforge hands an external kernel as `extra` when it calls one itself: MindSpore's interface
// over the op's attrs, with MindSpore's types (a float attr is a float32, as MindSpore keeps it).
class Extra final : public AotExtra {
 public:
  struct Value {
    int kind = 0;  // opforge_aot_extra_add's kinds
    bool b = false;
    int64_t i = 0;
    double f = 0;
    std::string s;
    std::vector<int64_t> ints;
    std::vector<double> floats;
  };
  std::vector<std::pair<std::string, Value>> values;

  bool HasAttr(std::string name) override { return find(name) != nullptr; }

 private:
  const Value* find(const std::string& name) const {
    for (const auto& [n, v] : values) {
      if (n == name) return &v;
    }
    return nullptr;
  }
  const Value& get(const std::string& name, int kind, const char* type) const {
    const Value* v = find(name);
    if (!v) throw std::runtime_error("the kernel asked for attr '" + name + "', which the op does not give");
    if (v->kind != kind) throw std::runtime_error("the kernel asked for attr '" + name + "' as " + type + ", a type it is not");
    return *v;
  }
  bool GetAttrBool(std::string name) override { return get(name, 0, "bool").b; }
  int64_t GetAttrInt(std::string name) override { return get(name, 1, "int").i; }
  float GetAttrFloat(std::string name) override { return static_cast<float>(get(name, 2, "float").f); }
  std::string GetAttrStr(std::string name) override { return get(name, 3, "str").s; }
  std::vector<int64_t> GetAttrIntVec(std::string name) override { return get(name, 4, "a list of int").ints; }
  std::vector<float> GetAttrFloatVec(std::string name) override {
    const Value& v = get(name, 5, "a list of float");
    return std::vector<float>(v.floats.begin(), v.floats.end());
  }
  std::vector<std::vector<int64_t>> GetAttrInt2DVec(std::string name) override {
    throw std::runtime_error("the kernel asked for attr '" + name + "' as a list of lists, which opforge attrs never are");
  }
  std::vector<std::vector<float>> GetAttrFloat2DVec(std::string name) override {
    throw std::runtime_error("the kernel asked for attr '" + name + "' as a list of lists, which opforge attrs never are");
  }
};

}  // namespace opforge_mirror

extern "C" void* opforge_aot_extra_new() {
  try {
    return static_cast<opforge_mirror::AotExtra*>(new opforge_mirror::Extra());
  } catch (...) {
    return nullptr;
  }
}

extern "C" void opforge_aot_extra_delete(void* extra) {
  delete static_cast<opforge_mirror::AotExtra*>(extra);
}

extern "C" bool opforge_aot_extra_add(void* extra, const char* name, int kind, int64_t i, double f, const char* s,
                                      const int64_t* ints, const double* floats, size_t n) {
  try {
    auto* ex = static_cast<opforge_mirror::Extra*>(static_cast<opforge_mirror::AotExtra*>(extra));
    opforge_mirror::Extra::Value v;
    v.kind = kind;
    v.b = i != 0;
    v.i = i;
    v.f = f;
    if (s) v.s = s;
    if (ints) v.ints.assign(ints, ints + n);
    if (floats) v.floats.assign(floats, floats + n);
    ex->values.emplace_back(name, std::move(v));
    return true;
  } catch (...) {
    return false;
  }
}

namespace {

char* copy(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

}  // namespace

extern "C" bool opforge_aot_extra_str(void* extra, const char* name, char** out, char** error) {
  *out = nullptr;
  *error = nullptr;
  if (!extra) return false;
  try {
    auto* ex = static_cast<opforge_mirror::AotExtra*>(extra);
    if (!ex->HasAttr(name)) return false;
    *out = copy(ex->Str(name));
    return true;
  } catch (const std::exception& e) {
    *error = copy(e.what());
  } catch (...) {
    *error = copy("unknown exception");
  }
  return false;
}
