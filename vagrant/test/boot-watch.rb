# Runs the Vagrantfile's hooks around `up` (as Vagrant applies them to its `up` action) over a
# machine that never boots, and over one that boots; prints what each ends with.
# Usage: ruby vagrant/test/boot-watch.rb DIR   (DIR: where the Vagrantfile is)
require "vagrant"

dir = ARGV.shift or abort "usage: boot-watch.rb DIR"
ARGV.clear
# Loading the environment evaluates the Vagrantfile, which registers its plugin.
Vagrant::Environment.new(cwd: File.expand_path(dir), ui_class: Vagrant::UI::Silent).vagrantfile

# The step of `up` that waits for the machine (Vagrant's WaitForCommunicator raises these).
class Boot
  def initialize(app, env)
    @app = app
    @outcome = env[:outcome]
  end

  def call(env)
    raise Vagrant::Errors::VMBootTimeout if @outcome == :timeout
    raise Vagrant::Errors::VMBootBadState, valid: "running", invalid: "shutoff" if @outcome == :stopped
    env[:booted] = true
    @app.call(env)
  end
end

VM = Struct.new(:boot_timeout)
Config = Struct.new(:vm)
Machine = Struct.new(:name, :config, :box, :provider_name)
%i[timeout stopped booted].each do |outcome|
  hook = Vagrant::Action::Hook.new
  Vagrant.plugin("2").manager.action_hooks(:machine_action_up).each { |h| h.call(hook) }
  builder = Vagrant::Action::Builder.new.use(Boot)
  hook.apply(builder)
  env = { outcome: outcome, machine: Machine.new(:"node-2", Config.new(VM.new(42))) }
  begin
    builder.to_app(env).call(env)
    puts "#{outcome}: booted=#{env[:booted]}"
  rescue Vagrant::Errors::VagrantError => e
    puts "#{outcome}: #{e.class}: #{e.message}"
  end
end
