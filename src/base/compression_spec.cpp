#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "base/compression_spec.hpp"
#include "base/units.hpp"
#include "gradcomm/error.hpp"

namespace gradcomm::compression {
namespace {

constexpr const char* kValidForms =
    "expected none | fp16 | bf16 | topk:<fraction in (0,1], e.g. 0.01> | topk:<element count, e.g. 1000>, "
    "optionally followed by :ef=0|1, :exact (topk only) and :prescale";

[[noreturn]] void fail(const std::string& text, const std::string& why) {
  throw ConfigError("compression spec '" + text + "' is not valid: " + why + "; " + kValidForms);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

bool allDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A decimal fraction only: strtod alone would also take "nan", "inf" and hex.
bool looksLikeFraction(const std::string& s) {
  if (s.empty()) return false;
  bool digit = false;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c))) digit = true;
    else if (c != '.' && c != 'e' && c != '+' && c != '-') return false;
  }
  return digit;
}

void parseAmount(const std::string& text, const std::string& amount, Spec& spec) {
  if (allDigits(amount)) {
    errno = 0;
    char* end = nullptr;
    unsigned long long v = std::strtoull(amount.c_str(), &end, 10);
    if (errno == ERANGE || v > std::numeric_limits<size_t>::max()) fail(text, "top-k count '" + amount + "' is too large");
    if (v == 0) fail(text, "top-k count must be at least 1");
    spec.count = static_cast<size_t>(v);
    return;
  }
  if (!looksLikeFraction(amount)) {
    fail(text, amount.empty() ? std::string("topk needs an amount") : "top-k amount '" + amount + "' is not a number");
  }
  char* end = nullptr;
  double r = std::strtod(amount.c_str(), &end);
  if (end != amount.c_str() + amount.size()) fail(text, "top-k amount '" + amount + "' is not a number");
  if (!(r > 0.0 && r <= 1.0)) fail(text, "top-k fraction " + amount + " is outside (0,1]");
  spec.ratio = r;
}

// Shortest decimal that reads back as the same double, always with a '.' or
// an exponent so that it parses as a fraction rather than a count.
std::string formatFraction(double r) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, r);
    if (std::strtod(buf, nullptr) == r) break;
  }
  std::string s(buf);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

const char* toString(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kFp16: return "fp16";
    case Kind::kBf16: return "bf16";
    case Kind::kTopK: return "topk";
  }
  return "?";
}

Spec Spec::parse(const std::string& original) {
  const std::string text = core::toLower(core::trim(original));
  std::vector<std::string> parts = split(text, ':');
  Spec spec;
  const std::string& head = parts[0];
  size_t next = 1;
  if (head == "none") spec.kind = Kind::kNone;
  else if (head == "fp16") spec.kind = Kind::kFp16;
  else if (head == "bf16") spec.kind = Kind::kBf16;
  else if (head == "topk") {
    spec.kind = Kind::kTopK;
    if (parts.size() < 2) fail(original, "topk needs an amount");
    parseAmount(original, parts[1], spec);
    spec.errorFeedback = true;
    spec.approximate = true;
    next = 2;
  } else {
    fail(original, head.empty() ? std::string("it is empty") : "unknown kind '" + head + "'");
  }
  if (spec.kind == Kind::kNone && parts.size() > 1) fail(original, "none takes no options");

  bool sawEf = false, sawExact = false, sawPrescale = false;
  for (size_t i = next; i < parts.size(); ++i) {
    const std::string& opt = parts[i];
    if (opt == "ef=0" || opt == "ef=1") {
      if (sawEf) fail(original, "ef is given twice");
      sawEf = true;
      spec.errorFeedback = opt == "ef=1";
    } else if (opt == "exact") {
      if (spec.kind != Kind::kTopK) fail(original, "exact applies to topk only");
      if (sawExact) fail(original, "exact is given twice");
      sawExact = true;
      spec.approximate = false;
    } else if (opt == "prescale") {
      if (sawPrescale) fail(original, "prescale is given twice");
      sawPrescale = true;
      spec.prescale = true;
    } else {
      fail(original, opt.empty() ? std::string("it has an empty option") : "unknown option '" + opt + "'");
    }
  }
  return spec;
}

std::string Spec::toString() const {
  std::string s = compression::toString(kind);
  if (kind == Kind::kNone) return s;
  if (kind == Kind::kTopK) {
    s += ":" + (count > 0 ? std::to_string(count) : formatFraction(ratio));
    if (!errorFeedback) s += ":ef=0";
    if (!approximate) s += ":exact";
  } else if (errorFeedback) {
    s += ":ef=1";
  }
  if (prescale) s += ":prescale";
  return s;
}

size_t Spec::topkCount(size_t n) const {
  if (kind != Kind::kTopK) {
    throw InvalidUsage(std::string("topkCount() asked of a '") + compression::toString(kind) +
                       "' spec; only topk specs select elements");
  }
  if (n == 0) return 0;
  size_t k = count;
  if (count == 0) {
    // ceil(ratio * n), but 0.01 is not exactly 1/100 in binary: shrink by a
    // relative 1e-12 so that 0.01 of 1000 is 10, not 11. long double keeps
    // the product exact enough for counts beyond 2^53.
    const long double product = static_cast<long double>(ratio) * static_cast<long double>(n);
    const long double want = std::ceil(product * (1.0L - 1e-12L));
    k = want >= static_cast<long double>(n) ? n : static_cast<size_t>(want);
  }
  if (k < 1) k = 1;
  return k > n ? n : k;
}

bool Spec::operator==(const Spec& o) const {
  return kind == o.kind && ratio == o.ratio && count == o.count && errorFeedback == o.errorFeedback &&
         prescale == o.prescale && approximate == o.approximate;
}

}  // namespace gradcomm::compression
