/*
 * The per-GPU kernel variant tables for the plugin (deamoeVariantTable.h). The JSON reader
 * below covers the JSON grammar (objects, arrays, strings with escapes, numbers, literals)
 * into a small tree; the tables are small files written by tuning.table_json.
 */
#include "deamoeVariantTable.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace deamoe
{
namespace plugin
{
namespace
{

struct Json
{
    enum class Kind
    {
        kNULL,
        kBOOL,
        kNUMBER,
        kSTRING,
        kARRAY,
        kOBJECT
    };
    Kind kind{Kind::kNULL};
    double number{0.0};
    std::string text;
    std::vector<Json> items;                          // kARRAY
    std::vector<std::pair<std::string, Json>> fields; // kOBJECT, in order

    Json const* field(std::string const& name) const
    {
        for (auto const& f : fields)
        {
            if (f.first == name)
                return &f.second;
        }
        return nullptr;
    }
};

class Reader
{
public:
    explicit Reader(std::string const& text)
        : mText(text)
    {
    }

    Json document()
    {
        Json value = parseValue(0);
        skipSpace();
        if (mPos != mText.size())
            error("trailing characters");
        return value;
    }

private:
    [[noreturn]] void error(std::string const& what) const
    {
        throw std::invalid_argument("not valid JSON (" + what + " at byte " + std::to_string(mPos) + ")");
    }

    void skipSpace()
    {
        while (mPos < mText.size() && std::isspace(static_cast<unsigned char>(mText[mPos])))
            ++mPos;
    }

    bool take(char c)
    {
        skipSpace();
        if (mPos < mText.size() && mText[mPos] == c)
        {
            ++mPos;
            return true;
        }
        return false;
    }

    void expect(char c)
    {
        if (!take(c))
            error(std::string("expected '") + c + "'");
    }

    Json parseValue(int depth)
    {
        if (depth > 64)
            error("nesting too deep");
        skipSpace();
        if (mPos >= mText.size())
            error("unexpected end");
        Json v;
        char const c = mText[mPos];
        if (c == '{')
        {
            ++mPos;
            v.kind = Json::Kind::kOBJECT;
            if (take('}'))
                return v;
            do
            {
                skipSpace();
                std::string name = parseString();
                expect(':');
                v.fields.emplace_back(std::move(name), parseValue(depth + 1));
            } while (take(','));
            expect('}');
        }
        else if (c == '[')
        {
            ++mPos;
            v.kind = Json::Kind::kARRAY;
            if (take(']'))
                return v;
            do
            {
                v.items.push_back(parseValue(depth + 1));
            } while (take(','));
            expect(']');
        }
        else if (c == '"')
        {
            v.kind = Json::Kind::kSTRING;
            v.text = parseString();
        }
        else if (literal("true"))
        {
            v.kind = Json::Kind::kBOOL;
            v.number = 1.0;
        }
        else if (literal("false"))
        {
            v.kind = Json::Kind::kBOOL;
        }
        else if (literal("null"))
        {
            v.kind = Json::Kind::kNULL;
        }
        else
        {
            v.kind = Json::Kind::kNUMBER;
            v.number = parseNumber();
        }
        return v;
    }

    bool literal(char const* word)
    {
        std::string const w(word);
        if (mText.compare(mPos, w.size(), w) != 0)
            return false;
        mPos += w.size();
        return true;
    }

    double parseNumber()
    {
        size_t const begin = mPos;
        while (mPos < mText.size()
            && (std::isdigit(static_cast<unsigned char>(mText[mPos])) || mText[mPos] == '-' || mText[mPos] == '+'
                || mText[mPos] == '.' || mText[mPos] == 'e' || mText[mPos] == 'E'))
            ++mPos;
        std::string const token = mText.substr(begin, mPos - begin);
        char* end = nullptr;
        double const value = token.empty() ? 0.0 : std::strtod(token.c_str(), &end);
        if (token.empty() || end != token.c_str() + token.size())
            error("bad value");
        return value;
    }

    std::string parseString()
    {
        if (mPos >= mText.size() || mText[mPos] != '"')
            error("expected a string");
        ++mPos;
        std::string out;
        while (mPos < mText.size() && mText[mPos] != '"')
        {
            char c = mText[mPos++];
            if (c == '\\')
            {
                if (mPos >= mText.size())
                    error("unterminated string");
                char const e = mText[mPos++];
                switch (e)
                {
                case 'n': c = '\n'; break;
                case 't': c = '\t'; break;
                case 'r': c = '\r'; break;
                case 'b': c = '\b'; break;
                case 'f': c = '\f'; break;
                case 'u':
                {
                    // The tables are ASCII; other code points are kept as '?', which no key
                    // or variant name contains.
                    if (mPos + 4 > mText.size())
                        error("bad \\u escape");
                    unsigned long const code = std::strtoul(mText.substr(mPos, 4).c_str(), nullptr, 16);
                    mPos += 4;
                    c = code < 0x80 ? static_cast<char>(code) : '?';
                    break;
                }
                default: c = e; break; // \" \\ \/
                }
            }
            out.push_back(c);
        }
        if (mPos >= mText.size())
            error("unterminated string");
        ++mPos;
        return out;
    }

    std::string const& mText;
    size_t mPos{0};
};

bool isTile(int32_t tokens)
{
    for (int32_t t : kTILE_TOKENS)
    {
        if (t == tokens)
            return true;
    }
    return false;
}

} // namespace

std::string variantTableFileName(std::string const& deviceName)
{
    std::string stem;
    bool gap = false;
    for (char c : deviceName)
    {
        if (std::isalnum(static_cast<unsigned char>(c)) && static_cast<unsigned char>(c) < 0x80)
        {
            if (gap && !stem.empty())
                stem.push_back('_');
            stem.push_back(c);
            gap = false;
        }
        else
        {
            gap = true;
        }
    }
    return stem.empty() ? std::string() : stem + ".json";
}

std::string variantShapeKey(LayerParams const& p)
{
    return "d" + std::to_string(p.hidden) + "-e" + std::to_string(p.numDepartments) + "x"
        + std::to_string(p.expertsPerDepartment) + "-s" + std::to_string(p.sharedWidth) + "-p"
        + std::to_string(p.privateWidth) + "-x" + std::to_string(p.sharedExpertWidth) + "-k" + std::to_string(p.topK);
}

char const* dtypeKey(DataType dtype) noexcept
{
    switch (dtype)
    {
    case DataType::kFLOAT: return "fp32";
    case DataType::kHALF: return "fp16";
    case DataType::kBF16: return "bf16";
    }
    return "";
}

int32_t variantIdOf(std::string const& name) noexcept
{
    for (int32_t id = 0; id < kNumVariants; ++id)
    {
        if (name == variantName(id))
            return id;
    }
    return 0;
}

size_t tileIndex(int32_t numTokens) noexcept
{
    for (size_t i = 0; i < kTILE_TOKENS.size(); ++i)
    {
        if (numTokens <= kTILE_TOKENS[i])
            return i;
    }
    return kTILE_TOKENS.size() - 1;
}

VariantTable VariantTable::parse(std::string const& text, std::string const& source)
{
    auto const bad = [&source](std::string const& what) {
        return std::invalid_argument("kernel variant table " + source + ": " + what);
    };
    Json doc;
    try
    {
        doc = Reader(text).document();
    }
    catch (std::invalid_argument const& e)
    {
        throw bad(e.what());
    }
    Json const* device = doc.kind == Json::Kind::kOBJECT ? doc.field("device") : nullptr;
    if (device == nullptr || device->kind != Json::Kind::kSTRING)
        throw bad("expected an object with a \"device\" name");
    Json const* entries = doc.field("entries");
    if (entries == nullptr || entries->kind != Json::Kind::kARRAY)
        throw bad("expected an \"entries\" list");
    VariantTable table;
    table.mDevice = device->text;
    for (size_t i = 0; i < entries->items.size(); ++i)
    {
        Json const& e = entries->items[i];
        auto const str = [&](char const* name) -> Json const* {
            Json const* f = e.kind == Json::Kind::kOBJECT ? e.field(name) : nullptr;
            return f != nullptr && f->kind == Json::Kind::kSTRING ? f : nullptr;
        };
        auto const integer = [&](char const* name) -> Json const* {
            Json const* f = e.kind == Json::Kind::kOBJECT ? e.field(name) : nullptr;
            return f != nullptr && f->kind == Json::Kind::kNUMBER && f->number == std::floor(f->number)
                    && std::fabs(f->number) < 1e9
                ? f
                : nullptr;
        };
        Json const *shape = str("shape"), *dtype = str("dtype"), *variant = str("variant");
        Json const *bits = integer("bits"), *tokens = integer("tokens");
        if (!shape || !dtype || !variant || !bits || !tokens)
            throw bad("entry " + std::to_string(i) + " needs shape, dtype, bits, tokens and variant");
        int32_t const tile = static_cast<int32_t>(tokens->number);
        if (!isTile(tile))
            throw bad(
                "entry " + std::to_string(i) + ": tokens must be one of (1, 2, 4, 8, 16), got " + std::to_string(tile));
        table.mCases[Key{shape->text, dtype->text, static_cast<int32_t>(bits->number)}][tile] = variant->text;
    }
    return table;
}

int32_t VariantTable::variant(std::string const& shape, DataType dtype, int32_t bits, int32_t numTokens) const
{
    auto const found = mCases.find(Key{shape, dtypeKey(dtype), bits});
    if (found == mCases.end() || found->second.empty())
        return 0;
    double const tile = std::log2(static_cast<double>(kTILE_TOKENS[tileIndex(numTokens)]));
    // Nearest listed tile in log2, ties to the smaller: the map is in ascending order, so the
    // first of equal distances wins.
    std::string const* best = nullptr;
    double bestDistance = 0.0;
    for (auto const& [listed, name] : found->second)
    {
        double const distance = std::fabs(std::log2(static_cast<double>(listed)) - tile);
        if (best == nullptr || distance < bestDistance)
        {
            best = &name;
            bestDistance = distance;
        }
    }
    return variantIdOf(*best);
}

std::array<int32_t, kTILE_TOKENS.size()> VariantTable::tileVariants(
    std::string const& shape, DataType dtype, int32_t bits) const
{
    std::array<int32_t, kTILE_TOKENS.size()> ids{};
    for (size_t i = 0; i < kTILE_TOKENS.size(); ++i)
        ids[i] = variant(shape, dtype, bits, kTILE_TOKENS[i]);
    return ids;
}

bool loadVariantTable(std::string const& dir, std::string const& deviceName, VariantTable& table)
{
    std::string const name = variantTableFileName(deviceName);
    if (dir.empty() || name.empty())
        return false;
    std::string const path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    if (!in)
        return false;
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad())
        throw std::invalid_argument("kernel variant table " + path + ": not readable");
    table = VariantTable::parse(text.str(), path);
    return true;
}

} // namespace plugin
} // namespace deamoe
