#include "tokenizer/jinja_eval.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "tokenizer/jinja_arith.h"
#include "tokenizer/jinja_builtins.h"

namespace xds::jinja {
namespace {

constexpr int kMaxDepth = 64;  // macro call depth
// A loop iteration builds the `loop` namespace (a dozen fields): it counts as this many steps.
constexpr int64_t kIterationSteps = 16;

[[noreturn]] void fail(int line, const std::string& msg) {
  throw TemplateError(fmt::format("line {}: {}", line, msg));
}

// The work a value stands for when it is built, copied or scanned (RenderLimits::max_steps):
// one per list or dict item, one per 64 bytes of a string (its own or an item's). Shallow:
// nested lists and dicts are shared, not copied.
int64_t cost_of(const Value& v) {
  auto bytes = [](const Value& x) {
    return x.is_string() ? static_cast<int64_t>(x.s.size() / 64) : int64_t{0};
  };
  int64_t c = 1 + bytes(v);
  if (v.is_list()) {
    for (const Value& x : *v.list) c += 1 + bytes(x);
  } else if (v.is_mapping()) {
    for (const auto& [k, x] : v.dict->items)
      c += 1 + static_cast<int64_t>(k.size() / 64) + bytes(x);
  }
  return c;
}

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const Dict& context, const RenderLimits& limits) : limits_(limits) {
    frames_.emplace_back();
    Dict g;
    add_globals(&g);
    for (auto& [k, v] : g.items) frames_[0][k] = v;
    for (const auto& [k, v] : context.items) frames_[0][k] = v;
  }

  Flow exec(const Body& body, Value* out) {
    const Deeper deeper(this, body.empty() ? 0 : body.front()->line);
    for (const auto& s : body) {
      const Flow f = exec_one(*s, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  // One level of evaluation inside another (RenderLimits::max_depth).
  class Deeper {
   public:
    Deeper(Interpreter* in, int line) : in_(in) {
      if (++in_->nesting_ > in_->limits_.max_depth) {
        --in_->nesting_;
        fail(line, fmt::format("evaluation nested deeper than {} levels", in_->limits_.max_depth));
      }
    }
    ~Deeper() { --in_->nesting_; }
    Deeper(const Deeper&) = delete;
    Deeper& operator=(const Deeper&) = delete;

   private:
    Interpreter* in_;
  };

  // Counts `n` steps of work (RenderLimits::max_steps).
  void charge(int64_t n) {
    steps_ += n;
    if (steps_ > limits_.max_steps) {
      throw TemplateError(
          fmt::format("more than {} steps of work (a loop that does not end?)", limits_.max_steps));
    }
  }
  // A string or list built here must stay within the limits.
  void check_size(const Value& v) const {
    if (v.is_string() && v.s.size() > limits_.max_string_bytes) {
      throw TemplateError(fmt::format("a string of more than {} bytes", limits_.max_string_bytes));
    }
    if (v.is_list() && v.list->size() > limits_.max_list_items) {
      throw TemplateError(fmt::format("a list of more than {} items", limits_.max_list_items));
    }
  }

  Value lookup(const std::string& name) const {
    for (size_t k = frames_.size(); k-- > 0;) {
      auto it = frames_[k].find(name);
      if (it != frames_[k].end()) return it->second;
    }
    return Value::undefined(name);
  }

  Flow exec_one(const Stmt& s, Value* out) {
    charge(1);
    switch (s.kind) {
      case Stmt::Kind::kText:  // the template's own text: trusted
        charge(static_cast<int64_t>(s.text.size() / 64));
        out->s += s.text;
        check_size(*out);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        append_str(out, to_str_value(eval(*s.expr)));
        check_size(*out);
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (cond == nullptr || truthy(eval(*cond))) return exec(body, out);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor: return exec_for(s, out);
      case Stmt::Kind::kSet: assign(s, eval(*s.expr)); return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        Value buf = Value::string("");
        exec(s.body, &buf);  // sized as it grows, like the output
        assign(s, std::move(buf));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: define_macro(s); return Flow::kNormal;
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void assign(const Stmt& s, Value v) {
    if (s.targets.size() == 1) {
      frames_.back()[s.targets[0]] = std::move(v);
      return;
    }
    Value ns = lookup(s.targets[0]);
    if (ns.type != Value::Type::kNamespace) {
      fail(s.line, fmt::format("cannot assign attribute '{}' on '{}' ({}): only namespace() objects "
                               "support attribute assignment", s.targets[1], s.targets[0], type_name(ns)));
    }
    if (reaches(v, ns.dict.get())) {
      fail(s.line, fmt::format("namespace '{}' cannot contain itself", s.targets[0]));
    }
    ns.dict->set(s.targets[1], std::move(v));
  }

  void bind_targets(const Stmt& s, Frame& f, const Value& item) {
    if (s.targets.size() == 1) {
      f[s.targets[0]] = item;
      return;
    }
    if (!item.is_list() || item.list->size() != s.targets.size()) {
      fail(s.line, fmt::format("cannot unpack {} into {} loop variables", repr(item), s.targets.size()));
    }
    for (size_t k = 0; k < s.targets.size(); ++k) f[s.targets[k]] = (*item.list)[k];
  }

  Flow exec_for(const Stmt& s, Value* out) {
    const Value seq = eval(*s.expr);
    if (seq.is_none()) fail(s.line, "'NoneType' object is not iterable");
    List items;
    try {
      items = iterate(seq);
    } catch (const TemplateError& e) {
      fail(s.line, e.what());
    }
    charge(static_cast<int64_t>(items.size()));
    frames_.emplace_back();
    if (s.filter) {
      List kept;
      for (const Value& it : items) {
        bind_targets(s, frames_.back(), it);
        if (truthy(eval(*s.filter))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      frames_.pop_back();
      return exec(s.else_body, out);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      charge(kIterationSteps);
      Frame& f = frames_.back();
      bind_targets(s, f, items[i]);
      Value loop = Value::new_namespace();
      Dict& d = *loop.dict;
      d.set("index", Value::integer(i + 1));
      d.set("index0", Value::integer(i));
      d.set("revindex", Value::integer(n - i));
      d.set("revindex0", Value::integer(n - i - 1));
      d.set("first", Value::boolean(i == 0));
      d.set("last", Value::boolean(i == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", i > 0 ? items[i - 1] : Value::undefined("previtem"));
      d.set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("nextitem"));
      d.set("cycle", Value::callable([i](Args& a, Kwargs&) {
        if (a.empty()) throw TemplateError("loop.cycle: no items");
        return a[static_cast<size_t>(i) % a.size()];
      }));
      f["loop"] = loop;
      const Flow fl = exec(s.body, out);
      if (fl == Flow::kBreak) break;
    }
    frames_.pop_back();
    return Flow::kNormal;
  }

  void define_macro(const Stmt& s) {
    const Stmt* m = &s;
    frames_.back()[s.targets[0]] = Value::callable([this, m](Args& a, Kwargs& k) {
      if (depth_ >= kMaxDepth) fail(m->line, fmt::format("macro '{}': recursion deeper than {}", m->targets[0], kMaxDepth));
      Frame f;
      for (size_t p = 0; p < m->params.size(); ++p) {
        const auto& [pname, def] = m->params[p];
        Value v = p < a.size() ? a[p] : Value::undefined(pname);
        for (const auto& [kn, kv] : k) {
          if (kn == pname) v = kv;
        }
        if (v.is_undefined() && def) v = eval(*def);
        f[pname] = v;
      }
      if (a.size() > m->params.size()) fail(m->line, fmt::format("macro '{}': too many arguments", m->targets[0]));
      // A macro sees the template's top-level names and its own parameters.
      std::vector<Frame> saved;
      saved.swap(frames_);
      frames_.push_back(saved[0]);
      frames_.push_back(std::move(f));
      ++depth_;
      Value buf = Value::string("");
      try {
        exec(m->body, &buf);
      } catch (...) {
        --depth_;
        saved[0] = std::move(frames_[0]);
        frames_.swap(saved);
        throw;
      }
      --depth_;
      saved[0] = std::move(frames_[0]);
      frames_.swap(saved);
      return buf;
    });
  }

  Value eval(const Expr& e) {
    try {
      const Deeper deeper(this, e.line);
      charge(1);
      Value v = eval_inner(e);
      if (v.is_string()) charge(static_cast<int64_t>(v.s.size() / 64));  // copied
      check_size(v);
      return v;
    } catch (const TemplateError& err) {
      const std::string msg = err.what();
      if (msg.starts_with("line ")) throw;
      fail(e.line, msg);
    }
  }

  // Evaluates the arguments of a call, filter or test, counting the work of scanning them.
  void eval_args(const Expr& e, Args* args, Kwargs* kwargs) {
    for (const auto& a : e.args) {
      args->push_back(eval(*a));
      charge(cost_of(args->back()));
    }
    for (const auto& [k, v] : e.kwargs) {
      kwargs->emplace_back(k, eval(*v));
      charge(cost_of(kwargs->back().second));
    }
  }

  static std::string undefined_msg(const Value& v) {
    return v.undefined_name.empty() ? "value is undefined" : fmt::format("'{}' is undefined", v.undefined_name);
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: {
        const Value obj = eval(*e.a);
        if (obj.is_undefined()) fail(e.line, undefined_msg(obj) + fmt::format(" (reading attribute '{}')", e.name));
        Value out = get_attr(obj, e.name);
        // A key is found by a scan of the dict; a method walks what it is bound to.
        if (obj.is_mapping() || out.type == Value::Type::kCallable) charge(cost_of(obj));
        return out;
      }
      case Expr::Kind::kItem: {
        const Value obj = eval(*e.a);
        const Value key = eval(*e.b);
        if (obj.is_undefined()) fail(e.line, undefined_msg(obj) + fmt::format(" (reading item {})", repr(key)));
        if (!obj.is_list()) charge(cost_of(obj));  // a dict scan, a string's code points
        return get_item(obj, key);
      }
      case Expr::Kind::kSlice: {
        const Value obj = eval(*e.a);
        auto opt = [&](const ExprPtr& p) { return p ? eval(*p) : Value(); };
        Value out = slice(obj, opt(e.args[0]), opt(e.args[1]), opt(e.args[2]));
        charge(cost_of(out));
        return out;
      }
      case Expr::Kind::kCall: {
        const Value fn = eval(*e.a);
        if (fn.type != Value::Type::kCallable) {
          if (fn.is_undefined()) fail(e.line, undefined_msg(fn) + " (unsupported function or method?)");
          fail(e.line, fmt::format("'{}' object is not callable", type_name(fn)));
        }
        Args args;
        Kwargs kwargs;
        eval_args(e, &args, &kwargs);
        Value out = (*fn.fn)(args, kwargs);
        charge(cost_of(out));
        return out;
      }
      case Expr::Kind::kFilter: {
        const Value v = eval(*e.a);
        charge(cost_of(v));
        Args args;
        Kwargs kwargs;
        eval_args(e, &args, &kwargs);
        Value out = apply_filter(e.name, v, args, kwargs);
        charge(cost_of(out));
        return out;
      }
      case Expr::Kind::kTest: {
        const Value v = eval(*e.a);
        charge(cost_of(v));
        Args args;
        Kwargs kwargs;
        eval_args(e, &args, &kwargs);
        return Value::boolean(apply_test(e.name, v, args) != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.a);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.type == Value::Type::kInt) return Value::integer(e.name == "-" ? int_neg(v.i) : v.i);
        if (v.type == Value::Type::kFloat) return Value::number(e.name == "-" ? -v.f : v.f);
        fail(e.line, fmt::format("bad operand type for unary {}: '{}'", e.name, type_name(v)));
      }
      case Expr::Kind::kBinary: return eval_binary(e);
      case Expr::Kind::kCond:
        if (truthy(eval(*e.a))) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined();
      case Expr::Kind::kList: {
        Value l = Value::new_list();
        for (const auto& a : e.args) l.list->push_back(eval(*a));
        charge(static_cast<int64_t>(e.args.size()));
        return l;
      }
      case Expr::Kind::kDict: {
        Value d = Value::new_dict();
        charge(static_cast<int64_t>(e.args.size()));
        for (size_t k = 0; k < e.args.size(); ++k) {
          const Value key = eval(*e.args[k]);
          if (!key.is_string()) fail(e.line, "dict literal keys must be strings");
          if (!key.taint.empty()) d.dict->untrusted_keys = true;
          d.dict->set(key.s, eval(*e.values[k]));
        }
        return d;
      }
    }
    fail(e.line, "unsupported expression");
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.a);
      return truthy(l) ? eval(*e.b) : l;
    }
    if (op == "or") {
      Value l = eval(*e.a);
      return truthy(l) ? l : eval(*e.b);
    }
    const Value l = eval(*e.a);
    const Value r = eval(*e.b);
    // Comparing, searching and concatenating walk both operands.
    charge(cost_of(l) + cost_of(r));
    if (op == "==") return Value::boolean(equals(l, r));
    if (op == "!=") return Value::boolean(!equals(l, r));
    if (op == "<") return Value::boolean(compare(l, r) < 0);
    if (op == ">") return Value::boolean(compare(l, r) > 0);
    if (op == "<=") return Value::boolean(compare(l, r) <= 0);
    if (op == ">=") return Value::boolean(compare(l, r) >= 0);
    if (op == "in") return Value::boolean(contains(r, l));
    if (op == "not in") return Value::boolean(!contains(r, l));
    if (op == "~") {
      Value out = to_str_value(l);
      append_str(&out, to_str_value(r));
      return out;
    }
    const bool ints = (l.type == Value::Type::kInt || l.type == Value::Type::kBool) &&
                      (r.type == Value::Type::kInt || r.type == Value::Type::kBool);
    const bool nums = (l.is_number() || l.type == Value::Type::kBool) && (r.is_number() || r.type == Value::Type::kBool);
    const int64_t li = l.type == Value::Type::kBool ? l.b : l.i, ri = r.type == Value::Type::kBool ? r.b : r.i;
    if (op == "+") {
      if (ints) return Value::integer(int_add(li, ri));
      if (nums) return Value::number(l.as_double() + r.as_double());
      if (l.is_string() && r.is_string()) {
        Value out = l;
        append_str(&out, r);
        return out;
      }
      if (l.is_list() && r.is_list()) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::new_list(std::move(out));
      }
    } else if (op == "-") {
      if (ints) return Value::integer(int_sub(li, ri));
      if (nums) return Value::number(l.as_double() - r.as_double());
    } else if (op == "*") {
      if (ints) return Value::integer(int_mul(li, ri));
      if (nums) return Value::number(l.as_double() * r.as_double());
      if ((l.is_string() || l.is_list()) && r.type == Value::Type::kInt) {
        if (r.i > 100000) fail(e.line, "repetition count too large");
        // Sized before it is built: 'x' * 100000 * 100000 must not allocate first.
        const auto times = static_cast<size_t>(std::max<int64_t>(r.i, 0));
        if (l.is_string() && l.s.size() * times > limits_.max_string_bytes) {
          fail(e.line, fmt::format("a string of more than {} bytes", limits_.max_string_bytes));
        }
        if (l.is_list() && l.list->size() * times > limits_.max_list_items) {
          fail(e.line, fmt::format("a list of more than {} items", limits_.max_list_items));
        }
        charge(cost_of(l) * static_cast<int64_t>(times));
        Value out = l.is_string() ? Value::string("") : Value::new_list();
        for (int64_t k = 0; k < r.i; ++k) {
          if (l.is_string()) {
            append_str(&out, l);
          } else {
            out.list->insert(out.list->end(), l.list->begin(), l.list->end());
          }
        }
        return out;
      }
    } else if (op == "/") {
      if (nums) {
        if (r.as_double() == 0) fail(e.line, "division by zero");
        return Value::number(l.as_double() / r.as_double());
      }
    } else if (op == "//" || op == "%") {
      if (ints) {
        if (ri == 0) fail(e.line, "integer division or modulo by zero");
        return Value::integer(op == "//" ? int_floordiv(li, ri) : int_mod(li, ri));
      }
      if (nums) {
        const double a = l.as_double(), b = r.as_double();
        if (b == 0) fail(e.line, "float division or modulo by zero");
        const double q = std::floor(a / b);
        return Value::number(op == "//" ? q : a - q * b);
      }
      if (l.is_string() && op == "%") fail(e.line, "unsupported construct: '%' string formatting");
    } else if (op == "**") {
      if (ints && ri >= 0) return Value::integer(int_pow(li, ri));
      if (nums) return Value::number(std::pow(l.as_double(), r.as_double()));
    }
    if (l.is_undefined() || r.is_undefined()) {
      fail(e.line, undefined_msg(l.is_undefined() ? l : r) + fmt::format(" (operand of '{}')", op));
    }
    fail(e.line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, type_name(l), type_name(r)));
  }

  std::vector<Frame> frames_;
  int depth_ = 0;  // macro calls
  const RenderLimits limits_;
  int nesting_ = 0;    // Deeper levels open
  int64_t steps_ = 0;  // work so far
};

}  // namespace

Value render(const Body& body, const Dict& context, const RenderLimits& limits) {
  Interpreter in(context, limits);
  Value out = Value::string("");
  in.exec(body, &out);
  return out;
}

}  // namespace xds::jinja
