# Prints the machines of a Vagrantfile as JSON (names, hostnames, private networks, synced
# folders, provisioners in order) as Vagrant's own loader sees them, without a box or provider.
# Usage: ruby vagrant/test/machines.rb [DIR] [-- VAGRANT-ARGS…]   (DIR: where the Vagrantfile is;
# default .). With VAGRANT-ARGS the Vagrantfile sees them as its command line (`-- up builder`),
# so what it does for that command (checks, the builder's source archive) happens as it would.
require "vagrant"
require "json"

dir = File.expand_path(ARGV[0] && ARGV[0] != "--" ? ARGV[0] : ".")
args = ARGV.include?("--") ? ARGV[(ARGV.index("--") + 1)..] : []
ARGV.replace(args)
env = Vagrant::Environment.new(cwd: dir, ui_class: Vagrant::UI::Silent)
defined = env.vagrantfile.config.vm.defined_vms
machines = env.machine_names.map do |name|
  config = env.vagrantfile.machine_config(name, nil, nil)[:config]
  vm = config.vm
  {
    name: name.to_s,
    # `vagrant up` without names brings up only these (the builder comes when named).
    autostart: defined[name].options.fetch(:autostart, true) ? true : false,
    hostname: vm.hostname,
    networks: vm.networks.filter_map do |kind, opts|
      next unless kind == :private_network
      { ip: opts[:ip], netmask: opts[:netmask] }
    end,
    synced_folders: vm.synced_folders.values.map do |f|
      { guest: f[:guestpath], host: f[:hostpath], type: f[:type]&.to_s, disabled: f[:disabled] ? true : false }
    end,
    provisioners: vm.provisioners.map do |p|
      c = p.config
      step = { name: p.name&.to_s, type: p.type.to_s }
      case p.type
      when :shell
        step.merge!(path: c.path && File.expand_path(c.path.to_s, dir), inline: c.inline,
                    args: Array(c.args).map(&:to_s), env: (c.env || {}).transform_keys(&:to_s).transform_values(&:to_s),
                    privileged: c.privileged)
      when :file
        step.merge!(source: File.expand_path(c.source.to_s, dir), destination: c.destination)
      end
      step
    end,
  }
end
puts JSON.pretty_generate(machines)
