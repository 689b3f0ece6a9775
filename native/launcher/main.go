// The native launcher: the `bulldozer` command the install step puts in the virtualenv's
// bin folder (scripts/bootstrap.sh), so that a command a warm loader takes is handed over
// without starting Python (bulldozer.cli.loader). Python's own start and the hand-over's
// imports were 20-30 ms of every warm run: a run with nothing to write through the loader,
// side by side, 211.9 -> 178.9 ms (median of 29 each).
//
// It does what bulldozer.cli.loader.client does, on the same wire: it finds this user's
// loaders in the registry (a folder only this user may enter), sends each in turn the
// command's arguments, working directory, environment and umask as one JSON request, with
// standard input, output and error as descriptors, and follows the first loader that forks
// the command: it passes Ctrl-C, SIGTERM and SIGHUP on to it, and exits with its exit code.
// Unlike the Python caller it sends every command, and the loader refuses those it does not
// take ("not taken", bulldozer.cli.loader.takes: the rule has one source). A command no
// loader takes runs in Python: the launcher replaces itself with the interpreter beside it,
// at bulldozer.cli.entry.local, which does not ask the loaders again.
//
// tests/integration/test_loader.py runs the hand-over's tests through both callers.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// firstReply is how long a loader may take to fork the command (it answers in milliseconds).
const firstReply = 30 * time.Second

// local is what the interpreter runs when no loader takes the command: sys.argv is then
// ["-c", argv0, args...].
const local = "import sys; del sys.argv[0]; from bulldozer.cli.entry import local; local()"

// pythonFlags: -P puts no folder first on sys.path for the -c script (bulldozer.settings.python_command:
// a command started in a folder holding a yaml.py must import the installed module).
const pythonFlags = "-P"

func main() {
	standardStreams()
	if code, ok := handOver(os.Args[1:]); ok {
		os.Exit(code)
	}
	runHere()
}

// standardStreams points each of descriptors 0, 1 and 2 the process was started without at
// the null device, as bulldozer.cli.process.standard_streams does: they are sent to the
// loader, and the command's output must not land in whatever file is opened next.
func standardStreams() {
	for fd := 0; fd < 3; fd++ {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			continue
		}
		null, err := syscall.Open("/dev/null", syscall.O_RDWR, 0)
		if err == nil && null != fd {
			syscall.Dup2(null, fd)
			syscall.Close(null)
		}
	}
}

// runHere replaces this process with the Python command (bulldozer.cli.entry.local).
func runHere() {
	exe, err := os.Executable()
	if err != nil {
		fail(70, "bulldozer: cannot find this command's own file: %v", err)
	}
	python := filepath.Join(filepath.Dir(exe), "python")
	args := append([]string{python, pythonFlags, "-c", local, os.Args[0]}, os.Args[1:]...)
	err = syscall.Exec(python, args, os.Environ())
	fail(70, "bulldozer: cannot start the Python interpreter beside this command (%s): %v", python, err)
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

// registry is bulldozer.cli.loader.registry: $XDG_RUNTIME_DIR, else /tmp, then
// bulldozer-loaders-<uid>.
func registry() string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = "/tmp"
	}
	return filepath.Join(dir, "bulldozer-loaders-"+strconv.Itoa(os.Getuid()))
}

// loaders are the registered loaders' sockets, in name order (os.ReadDir sorts them, as the
// Python caller's sorted() does); none when the registry is not
// a folder this user owns and no one else may enter.
func loaders() []string {
	folder := registry()
	var st syscall.Stat_t
	if syscall.Lstat(folder, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR ||
		int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		return nil
	}
	entries, err := os.ReadDir(folder)
	if err != nil {
		return nil
	}
	var socks []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sock") {
			socks = append(socks, filepath.Join(folder, e.Name()))
		}
	}
	return socks
}

// handOver runs the command in the first loader that takes it: its exit code and true, or
// false when none did (nothing ran).
func handOver(argv []string) (int, bool) {
	socks := loaders()
	if len(socks) == 0 {
		return 0, false
	}
	cwd, err := syscall.Getwd()
	if err != nil {
		return 0, false // a working directory that is gone: the command says so itself
	}
	body := request(argv, cwd)
	message := make([]byte, 4+len(body)) // REQUEST_HEADER: the body's length, big-endian
	binary.BigEndian.PutUint32(message, uint32(len(body)))
	copy(message[4:], body)
	for _, path := range socks {
		conn, ok := send(path, message)
		if !ok {
			continue // no loader listens there (a stale link), or not this user's
		}
		code, ran := follow(conn, path)
		conn.Close()
		if ran {
			return code, true
		}
	}
	return 0, false
}

// send connects to the loader socket at path, checks that a process of this user listens
// there (one of another user gets nothing: an environment may hold secrets) and sends the
// message, the standard descriptors with its first bytes.
func send(path string, message []byte) (*os.File, bool) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	if err := connect(fd, path); err != nil {
		syscall.Close(fd)
		return nil, false
	}
	cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil || int(cred.Uid) != os.Getuid() {
		syscall.Close(fd)
		return nil, false
	}
	sent, err := syscall.SendmsgN(fd, message, syscall.UnixRights(0, 1, 2), nil, 0)
	for err == nil && sent < len(message) {
		var n int
		n, err = syscall.Write(fd, message[sent:])
		sent += n
	}
	if err != nil || syscall.SetNonblock(fd, true) != nil {
		syscall.Close(fd)
		return nil, false
	}
	return os.NewFile(uintptr(fd), path), true // non-blocking: its reads take deadlines
}

// connect connects fd to the socket at path; a path longer than a socket address holds
// (a deep home) is reached through its folder, as bulldozer.sockets.at_unix_path does.
func connect(fd int, path string) error {
	if len(path) <= socketPathMax {
		return syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
	}
	dir, err := syscall.Open(filepath.Dir(path), oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(dir)
	return syscall.Connect(fd, &syscall.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(dir) + "/" + filepath.Base(path)})
}

// socketPathMax is bulldozer.sockets.SOCKET_PATH_MAX: the longest path a Unix socket
// address holds (sun_path's 108 bytes, one of them the terminating NUL).
const socketPathMax = 107

// oPath is Linux's O_PATH (the syscall package does not name it): a descriptor of the folder
// for /proc/self/fd/N/NAME.
const oPath = 0x200000

// reply is a line the loader sends: the command's pid, its exit code, or why it refused.
type reply struct {
	Pid     *int    `json:"pid"`
	Exit    *int    `json:"exit"`
	Refused *string `json:"refused"`
}

// follow is the command's exit code once the loader at path forked it, and true; false
// when the loader refused it. A line this caller cannot read counts as no reply.
func follow(conn *os.File, path string) (int, bool) {
	lines := bufio.NewReader(conn)
	next := func() (*reply, error) {
		line, err := lines.ReadBytes('\n')
		if err != nil {
			return nil, err
		}
		var r reply
		if json.Unmarshal(line, &r) != nil {
			return nil, nil
		}
		return &r, nil
	}
	conn.SetReadDeadline(time.Now().Add(firstReply))
	first, err := next()
	if os.IsTimeout(err) {
		// it may have forked the command meanwhile: running it here too could run it twice
		// (the command, if it started, dies with this process)
		fmt.Fprintf(os.Stderr, "error: the loader at %s did not answer within %.0f s; stop it "+
			"(bulldozer loader stop) or run without it (BULLDOZER_LOADER=off)\n", path, firstReply.Seconds())
		return 1, true
	}
	if first != nil && first.Exit != nil {
		return *first.Exit, true // the command died before it could say its pid
	}
	if first != nil && first.Refused != nil && *first.Refused == "upgraded" {
		fmt.Fprintf(os.Stderr, "warning: the loader at %s ran code older than this installation; it is stopping, and "+
			"this command runs on its own (bulldozer loader start starts a loader with the new code)\n", path)
	}
	if first == nil || first.Pid == nil {
		return 0, false // refused (not taken, not its home, stopping, upgraded), or gone before it forked
	}
	conn.SetReadDeadline(time.Time{})
	child := *first.Pid
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for s := range signals {
			syscall.Kill(child, s.(syscall.Signal))
		}
	}()
	for {
		r, err := next()
		if err != nil {
			break
		}
		if r != nil && r.Exit != nil {
			return *r.Exit, true
		}
	}
	fmt.Fprintf(os.Stderr, "bulldozer: the loader stopped while this command (pid %d) ran; its outcome is in the "+
		"run's record (bulldozer runs)\n", child)
	return 1, true
}

// request is the JSON body bulldozer.cli.loader.client sends: the arguments, the working
// directory, the environment and the umask.
func request(argv []string, cwd string) []byte {
	var b strings.Builder
	b.WriteString(`{"argv": [`)
	for i, a := range argv {
		if i > 0 {
			b.WriteString(", ")
		}
		quote(&b, a)
	}
	b.WriteString(`], "cwd": `)
	quote(&b, cwd)
	b.WriteString(`, "env": {`)
	first := true
	for _, kv := range os.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue // Python's os.environ has no such entry either
		}
		if !first {
			b.WriteString(", ")
		}
		first = false
		quote(&b, k)
		b.WriteString(": ")
		quote(&b, v)
	}
	umask := syscall.Umask(0)
	syscall.Umask(umask)
	b.WriteString(`}, "umask": ` + strconv.Itoa(umask) + "}")
	return []byte(b.String())
}

// quote writes s as a JSON string of the text Python makes of the same bytes (the file
// system's encoding, UTF-8 with surrogateescape: a byte no UTF-8 sequence takes is the
// lone surrogate U+DC00 + byte), in ASCII as json.dumps writes it; the loader, decoding
// with surrogateescape, gets the very bytes back.
func quote(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	u := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&15])
		b.WriteByte(hex[r>>8&15])
		b.WriteByte(hex[r>>4&15])
		b.WriteByte(hex[r&15])
	}
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 {
			u(0xdc00 + rune(s[i]))
			i++
			continue
		}
		i += n
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (r >= 0x7f && r < 0x10000):
			u(r)
		case r >= 0x10000:
			r -= 0x10000
			u(0xd800 + r>>10)
			u(0xdc00 + r&0x3ff)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
