// javac in one JVM for many builds (tests/java_compiler.py): each line on stdin is one
// javac command line, its arguments separated by NUL; for each, the answer is a line
// "EXIT_CODE BYTES" and then javac's messages (BYTES of UTF-8), as the javac command prints
// them. javax.tools' compiler is the one the javac command runs, with the same arguments
// and messages; a build here only skips starting a JVM (2-3 CPU-s a build on a 2-core machine).
import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;

public class Javac {
  public static void main(String[] ignored) throws Exception {
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    OutputStream out = new BufferedOutputStream(System.out);
    for (String line; (line = in.readLine()) != null; ) {
      ByteArrayOutputStream said = new ByteArrayOutputStream();
      int code = javac.run(null, said, said, line.split("\0"));
      byte[] text = said.toByteArray();
      out.write((code + " " + text.length + "\n").getBytes(StandardCharsets.UTF_8));
      out.write(text);
      out.flush();
    }
  }
}
