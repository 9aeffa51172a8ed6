package pipeline

import (
	"fmt"
	"math"
	"reflect"
	"strconv"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
)

// Checked arithmetic. expr-lang's integer +, -, * and unary minus wrap
// around int64 silently, and its float operators give ±Inf or NaN, which
// a result row can only write as null. compileExpr rewrites, at load,
// every such operation of an expression into a call of one of the
// functions below, which fail instead: the record goes to the dead-letter
// output with the reason, like an integer division by zero. The names
// cannot be written in an expression (they are not identifiers).
const (
	fnAddInt   = "$add"
	fnSubInt   = "$sub"
	fnMulInt   = "$mul"
	fnNegInt   = "$neg"
	fnAbsInt   = "$abs"
	fnIntFloat = "$int"
	fnAddFloat = "$addf"
	fnSubFloat = "$subf"
	fnMulFloat = "$mulf"
	fnDivFloat = "$divf"
	fnPowFloat = "$powf"
)

// checkedOptions are the expr options that declare the checked functions
// and rewrite the arithmetic of an expression into calls of them, with
// the visitor that does it, whose err is the error of an operation of
// constants that overflows (compileExpr reports it).
func checkedOptions() ([]expr.Option, *checkedArith) {
	intOp := new(func(int, int) int)
	floatOp := new(func(float64, float64) float64)
	v := &checkedArith{}
	return []expr.Option{
		expr.Function(fnAddInt, checkedFuncs[fnAddInt], intOp),
		expr.Function(fnSubInt, checkedFuncs[fnSubInt], intOp),
		expr.Function(fnMulInt, checkedFuncs[fnMulInt], intOp),
		expr.Function(fnNegInt, checkedFuncs[fnNegInt], new(func(int) int)),
		expr.Function(fnAbsInt, checkedFuncs[fnAbsInt], new(func(int) int)),
		expr.Function(fnIntFloat, checkedFuncs[fnIntFloat], new(func(float64) int)),
		expr.Function(fnAddFloat, checkedFuncs[fnAddFloat], floatOp),
		expr.Function(fnSubFloat, checkedFuncs[fnSubFloat], floatOp),
		expr.Function(fnMulFloat, checkedFuncs[fnMulFloat], floatOp),
		expr.Function(fnDivFloat, checkedFuncs[fnDivFloat], floatOp),
		expr.Function(fnPowFloat, checkedFuncs[fnPowFloat], floatOp),
		expr.Patch(v),
	}, v
}

// checkedArith is the expr visitor that replaces the arithmetic of
// numbers by calls of the checked functions. It runs after the type check,
// so each node knows its operands' types; an operand whose type is not
// known at load (an element of an untyped array) is left as it is. An
// operation of constants (1000 * 60) is computed here: left as it is
// when in range, for expr's optimizer to fold, and reported in err when
// not.
type checkedArith struct {
	consts map[ast.Node]any // the values of the constant nodes seen
	err    error            // the first operation of constants out of range
}

// constant returns n's value when it is a number known at load.
func (v *checkedArith) constant(n ast.Node) (any, bool) {
	switch x := n.(type) {
	case *ast.IntegerNode:
		return x.Value, true
	case *ast.FloatNode:
		return x.Value, true
	}
	c, ok := v.consts[n]
	return c, ok
}

func (v *checkedArith) Visit(n *ast.Node) {
	var fn string
	var out reflect.Type
	var args []ast.Node
	switch x := (*n).(type) {
	case *ast.BinaryNode:
		l, r := x.Left.Type(), x.Right.Type()
		switch {
		case isIntType(l) && isIntType(r):
			out = intType
			switch x.Operator {
			case "+":
				fn = fnAddInt
			case "-":
				fn = fnSubInt
			case "*":
				fn = fnMulInt
			case "/":
				fn, out = fnDivFloat, floatType
			case "**", "^":
				fn, out = fnPowFloat, floatType
			}
		case isNumType(l) && isNumType(r):
			out = floatType
			switch x.Operator {
			case "+":
				fn = fnAddFloat
			case "-":
				fn = fnSubFloat
			case "*":
				fn = fnMulFloat
			case "/":
				fn = fnDivFloat
			case "**", "^":
				fn = fnPowFloat
			}
		}
		args = []ast.Node{x.Left, x.Right}
	case *ast.UnaryNode:
		if x.Operator == "-" && isIntType(x.Node.Type()) {
			fn, out, args = fnNegInt, intType, []ast.Node{x.Node}
		}
	case *ast.BuiltinNode:
		if len(x.Arguments) != 1 {
			return
		}
		a := x.Arguments[0]
		switch {
		case x.Name == "abs" && isIntType(a.Type()):
			fn, out, args = fnAbsInt, intType, []ast.Node{a}
		case x.Name == "int" && isFloatType(a.Type()):
			fn, out, args = fnIntFloat, intType, []ast.Node{a}
		}
	}
	if fn == "" {
		return
	}
	vals := make([]any, len(args))
	constant := true
	for i, a := range args {
		vals[i], constant = v.constant(a)
		if !constant {
			break
		}
	}
	if constant {
		c, err := checkedFuncs[fn](vals...)
		if err == nil {
			if v.consts == nil {
				v.consts = map[ast.Node]any{}
			}
			v.consts[*n] = c
			return
		}
		if v.err == nil {
			v.err = err
		}
	}
	patchCall(n, fn, out, args...)
}

// checkedFuncs are the checked functions by name.
var checkedFuncs = map[string]func(...any) (any, error){
	fnAddInt:   checkedInt("+"),
	fnSubInt:   checkedInt("-"),
	fnMulInt:   checkedInt("*"),
	fnNegInt:   checkedNeg,
	fnAbsInt:   checkedAbs,
	fnIntFloat: checkedIntOfFloat,
	fnAddFloat: checkedFloat("+"),
	fnSubFloat: checkedFloat("-"),
	fnMulFloat: checkedFloat("*"),
	fnDivFloat: checkedFloat("/"),
	fnPowFloat: checkedFloat("**"),
}

func patchCall(n *ast.Node, fn string, out reflect.Type, args ...ast.Node) {
	c := &ast.CallNode{Callee: &ast.IdentifierNode{Value: fn}, Arguments: args}
	c.SetType(out)
	ast.Patch(n, c)
}

var (
	intType   = reflect.TypeFor[int]()
	floatType = reflect.TypeFor[float64]()
)

func isIntType(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return true
	}
	return false
}

func isFloatType(t reflect.Type) bool {
	return t != nil && (t.Kind() == reflect.Float64 || t.Kind() == reflect.Float32)
}

func isNumType(t reflect.Type) bool { return isIntType(t) || isFloatType(t) }

// toInt64 returns an integer operand: a literal is an int, a field an
// int64.
func toInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case int16:
		return int64(x), true
	case int8:
		return int64(x), true
	}
	return 0, false
}

func toFloat64(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	}
	if i, ok := toInt64(v); ok {
		return float64(i), true
	}
	return 0, false
}

// checkedInt returns the function of integer operator op, which fails
// with ErrIntOverflow when the result does not fit in int64.
func checkedInt(op string) func(args ...any) (any, error) {
	return func(args ...any) (any, error) {
		a, ok1 := toInt64(args[0])
		b, ok2 := toInt64(args[1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%T %s %T: want integers", args[0], op, args[1])
		}
		var r int64
		var over bool
		switch op {
		case "+":
			r = a + b
			over = (b > 0 && r < a) || (b < 0 && r > a)
		case "-":
			r = a - b
			over = (b < 0 && r < a) || (b > 0 && r > a)
		case "*":
			r = a * b
			over = a != 0 && (r/a != b || (a == -1 && b == math.MinInt64))
		}
		if over {
			return nil, fmt.Errorf("%w: %d %s %d", ErrIntOverflow, a, op, b)
		}
		return r, nil
	}
}

func checkedNeg(args ...any) (any, error) {
	a, ok := toInt64(args[0])
	if !ok {
		return nil, fmt.Errorf("-%T: want an integer", args[0])
	}
	if a == math.MinInt64 {
		return nil, fmt.Errorf("%w: -(%d)", ErrIntOverflow, a)
	}
	return -a, nil
}

func checkedAbs(args ...any) (any, error) {
	a, ok := toInt64(args[0])
	if !ok {
		return nil, fmt.Errorf("abs(%T): want an integer", args[0])
	}
	switch {
	case a == math.MinInt64:
		return nil, fmt.Errorf("%w: abs(%d)", ErrIntOverflow, a)
	case a < 0:
		return -a, nil
	}
	return a, nil
}

// checkedIntOfFloat is int() of a float: its integer part, which must
// fit in int64 (Go's conversion of a larger float, or of a NaN, gives
// whatever the CPU gives).
func checkedIntOfFloat(args ...any) (any, error) {
	f, ok := toFloat64(args[0])
	if !ok {
		return nil, fmt.Errorf("int(%T): want a number", args[0])
	}
	// -2^63 is a float64; 2^63 is the first float64 above MaxInt64.
	if !(f >= math.MinInt64 && f < math.MaxInt64) {
		return nil, fmt.Errorf("%w: int(%s)", ErrIntOverflow, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return int64(f), nil
}

// checkedFloat returns the function of float operator op (of numbers
// either of which may be an integer), which fails with ErrNotFinite when
// the result is ±Inf or NaN: a float overflow, a division by zero.
func checkedFloat(op string) func(args ...any) (any, error) {
	return func(args ...any) (any, error) {
		a, ok1 := toFloat64(args[0])
		b, ok2 := toFloat64(args[1])
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%T %s %T: want numbers", args[0], op, args[1])
		}
		var r float64
		switch op {
		case "+":
			r = a + b
		case "-":
			r = a - b
		case "*":
			r = a * b
		case "/":
			r = a / b
		case "**":
			r = math.Pow(a, b)
		}
		if math.IsInf(r, 0) || math.IsNaN(r) {
			return nil, fmt.Errorf("%w: %s %s %s is %s", ErrNotFinite, fmtFloat(a), op, fmtFloat(b), fmtFloat(r))
		}
		return r, nil
	}
}

func fmtFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
