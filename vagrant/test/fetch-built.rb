# Runs the Vagrantfile's builder trigger (PodpathLab.fetch_built) against a machine whose files
# are in a directory of this host (the namespace harness's chroot of the builder), as Vagrant
# runs it against the builder VM over SCP. Prints whether it fetched anything.
# Usage: ruby vagrant/test/fetch-built.rb DIR MACHINE-ROOT DEST   (DIR: where the Vagrantfile is)
require "vagrant"
require "fileutils"

dir, machine_root, dest = ARGV.shift(3)
abort "usage: fetch-built.rb DIR MACHINE-ROOT DEST" unless dest
ARGV.clear
# Loading the environment evaluates the Vagrantfile, which defines PodpathLab.
Vagrant::Environment.new(cwd: File.expand_path(dir), ui_class: Vagrant::UI::Silent).vagrantfile

# A communicator that reads the machine's files from its root directory here.
Communicator = Struct.new(:root) do
  def download(from, to)
    src = File.join(root, from)
    raise "#{from}: no such file on the machine" unless File.file?(src)
    FileUtils.cp(src, to)
  end

  # `test -f PATH` (the one test the trigger makes).
  def test(command)
    path = command[/\Atest -f (\S+)\z/, 1] or raise "unexpected test #{command.inspect}"
    File.file?(File.join(root, path))
  end
end
Machine = Struct.new(:communicate)
problem = PodpathLab.fetch_built(Machine.new(Communicator.new(machine_root)), dest)
puts(problem || "fetched to #{dest}")
